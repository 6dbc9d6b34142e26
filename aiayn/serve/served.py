"""What one server answers requests with: the model, its limits, and the worker of its kind
-- the generation engine of a decoder-only model, the translator of an encoder-decoder, or
the embedder of an encoder.  The routers (aiayn/serve/routes/) read it; nothing else is
shared between them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer, Tokenizer
from aiayn.errors import RequestError
from aiayn.generate.chat import end_ids
from aiayn.interop.generation_config import GenerationIds
from aiayn.interop.sentence_transformers import Pooling
from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM, TransformerModel
from aiayn.serve.completion import Completer, Limits
from aiayn.serve.embeddings import Embedder
from aiayn.serve.engine import Engine
from aiayn.serve.translator import Translator

EOS_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


def eos_id(tokenizer: Tokenizer) -> int | None:
    """The end-of-text token of a BPE tokenizer that has one (GPT-2's ``<|endoftext|>``, ...)."""
    if not isinstance(tokenizer, BPETokenizer):
        return None
    for name in EOS_TOKENS:
        found = tokenizer.tok.token_to_id(name)
        if found is not None:
            return int(found)
    return None


def stop_ids(tokenizer: Tokenizer, generation: GenerationIds) -> tuple[int, ...]:
    """The ids that end a request: the checkpoint's own (generation_config.json's EOS ids, the
    tokenizer's ``eos_token``), else an end-of-text token found by name (``eos_id``)."""
    if isinstance(tokenizer, BPETokenizer):
        named = end_ids(tokenizer, generation)
        if named:
            return named
    guessed = eos_id(tokenizer)
    return () if guessed is None else (guessed,)


def shared_context(model_max_len: int, context: int | None, **limits: int | None) -> int:
    """The context every request shares (at most 4,096 by default), once the server's limits
    are checked: each a clear error naming the setting."""
    unset = " (or unset: the context)"
    for key, value in limits.items():
        least = 0 if key == "max_queue" else 1
        note = unset if key in ("max_prompt_tokens", "max_new_tokens") else ""
        if value is not None and value < least:
            raise RequestError(f"{key}={value}: expected at least {least}{note}")
    if context is not None and not 2 <= context <= model_max_len:
        raise RequestError(f"context={context}: expected 2 to the model's max_len={model_max_len}")
    return min(model_max_len, context or 4096)


@dataclass
class ServedModel:
    """The model behind the routes, its name in responses, the shared context ``max_len``,
    and its one worker (the other two are None); ``completer`` is the engine with the
    server's prompt and completion limits."""

    model: TransformerModel
    tokenizer: Tokenizer
    name: str
    max_len: int
    max_batch: int
    engine: Engine | None
    translator: Translator | None
    embedder: Embedder | None
    completer: Completer | None
    created: int = field(default_factory=lambda: int(time.time()))  # /v1/models' "created"


def serve_model(
    model: TransformerModel,
    tokenizer: Tokenizer,
    *,
    name: str,
    max_batch: int,
    max_queue: int,
    max_prompt_tokens: int | None,
    max_new_tokens: int | None,
    max_stop_chars: int,
    max_n: int,
    prefill_chunk: int,
    batching: bool,
    context: int | None,
    generation: GenerationIds,
    pooling: Pooling,
) -> ServedModel:
    """``model`` ready to serve, its limits checked (see ``aiayn.serve.app.create_app``)."""
    max_len = shared_context(
        model.config.max_len,
        context,
        max_batch=max_batch,
        max_queue=max_queue,
        prefill_chunk=prefill_chunk,
        max_prompt_tokens=max_prompt_tokens,
        max_new_tokens=max_new_tokens,
        max_stop_chars=max_stop_chars,
        max_n=max_n,
    )
    engine, translator, embedder = _worker(
        model,
        tokenizer,
        max_batch=max_batch,
        max_queue=max_queue,
        prefill_chunk=prefill_chunk,
        batching=batching,
        context=max_len,
        generation=generation,
        pooling=pooling,
    )
    completer = None
    if engine is not None:
        limits = Limits(
            context=max_len,
            prompt=max_len - 1
            if max_prompt_tokens is None
            else min(max_prompt_tokens, max_len - 1),
            new=max_len if max_new_tokens is None else max_new_tokens,
            stop_chars=max_stop_chars,
            choices=max_n,
        )
        completer = Completer(engine, tokenizer, model.config.vocab_size, limits)
    return ServedModel(
        model, tokenizer, name, max_len, max_batch, engine, translator, embedder, completer
    )


def _worker(
    model: TransformerModel,
    tokenizer: Tokenizer,
    *,
    max_batch: int,
    max_queue: int,
    prefill_chunk: int,
    batching: bool,
    context: int,
    generation: GenerationIds,
    pooling: Pooling,
) -> tuple[Engine | None, Translator | None, Embedder | None]:
    """What answers the requests: the generation engine of a decoder-only model, the
    translator of an encoder-decoder, or the embedder of an encoder (the others are None)."""
    if isinstance(model, DecoderLM):
        return (
            Engine(
                model,
                tokenizer.decode,
                max_batch=max_batch,
                max_queue=max_queue,
                prefill_chunk=prefill_chunk,
                eos_id=stop_ids(tokenizer, generation),
                batching=batching,
                context=context,
            ),
            None,
            None,
        )
    if isinstance(model, EncoderDecoder) and isinstance(tokenizer, BPETokenizer | MarianTokenizer):
        return None, Translator(model, tokenizer, max_queue, generation), None
    if isinstance(model, EncoderLM) and model.config.vision.image_size is None:
        return None, None, Embedder(model, tokenizer, pooling, max_queue)
    raise RequestError(f"a {type(model).__name__} cannot be served: it does not generate text")
