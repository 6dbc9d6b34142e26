"""A conversation with a chat model, one streamed reply at a time.

Each turn renders the whole conversation with the checkpoint's own chat template
(aiayn/interop/chat_template.py), as transformers' ``apply_chat_template`` with
``add_generation_prompt=True`` does, and continues it until an end token: the folder's
``eos_token_id`` (generation_config.json, one id or several) or the tokenizer's own
``eos_token`` (a chat model's end of turn, such as ChatML's ``<|im_end|>``).  The end token is
not part of the reply; the reply joins the conversation as the assistant's message.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiayn.data.tokenizer import BPETokenizer
from aiayn.errors import UserError
from aiayn.generate.lm import stream
from aiayn.generate.sampling import SamplingConfig
from aiayn.generate.text import TextStream
from aiayn.interop.chat_template import chat_ids
from aiayn.interop.generation_config import GenerationIds
from aiayn.models.decoder import DecoderLM


def end_ids(tokenizer: BPETokenizer, generation: GenerationIds) -> tuple[int, ...]:
    """The ids that end a reply: the folder's EOS ids, then the tokenizer's ``eos_token``."""
    ids = list(generation.eos)
    named = tokenizer.special_tokens.get("eos_token")
    found = tokenizer.tok.token_to_id(named) if named else None
    if found is not None and found not in ids:
        ids.append(int(found))
    return tuple(ids)


@dataclass
class Chat:
    """The conversation so far, and how to continue it."""

    model: DecoderLM
    tokenizer: BPETokenizer
    generation: GenerationIds
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_new_tokens: int = 256
    seed: int | None = None
    system: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.tokenizer.chat_template:
            raise UserError(
                "this checkpoint has no chat_template in its tokenizer_config.json: it is not"
                " a chat model (use `aiayn generate` to continue plain text)"
            )
        if not end_ids(self.tokenizer, self.generation):
            raise UserError(
                "this checkpoint names no end token (eos_token_id in generation_config.json or"
                " eos_token in tokenizer_config.json): a reply would never end"
            )
        self.reset()

    def reset(self) -> None:
        """Forget every turn (the system message stays)."""
        self.messages = [] if self.system is None else [{"role": "system", "content": self.system}]

    def prompt_ids(self, text: str) -> list[int]:
        """The ids the model reads for the user's next message ``text``."""
        ids = chat_ids(self.tokenizer, [*self.messages, {"role": "user", "content": text}])
        limit = self.model.config.max_len
        if len(ids) >= limit:
            raise UserError(
                f"the conversation is {len(ids)} tokens, and the model reads at most {limit}:"
                " start a new one (reset)"
            )
        return ids

    def reply(self, text: str) -> Iterator[str]:
        """Stream the reply to the user's ``text``, piece by piece; then keep both turns."""
        ids = self.prompt_ids(text)
        stop = end_ids(self.tokenizer, self.generation)
        shown = TextStream(self.tokenizer.decode, ids)
        pieces: list[str] = []
        for token in stream(
            self.model,
            [ids],
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            seed=self.seed,
            eos_id=stop,
        ):
            if int(token[0]) in stop:
                break
            piece = shown.add(int(token[0]))
            pieces.append(piece)
            yield piece
        pieces.append(shown.rest())
        yield pieces[-1]
        self.messages += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": "".join(pieces)},
        ]
