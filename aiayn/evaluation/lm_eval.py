"""lm-evaluation-harness in process: an aiayn language model as lm-eval's model ``aiayn``.

lm-eval asks a model three things: the log-likelihood of a continuation after a context
(multiple-choice tasks), the log-likelihood of a whole document in windows of the context
(perplexity tasks), and a greedy generation until a stop string (``generate_until``).
``AiaynLM`` answers them with the model itself, no server: lm-eval's ``TemplateLM``
splits each context and continuation into tokens as it does for its ``hf`` model and for
``local-completions``, and the scores are those of ``aiayn serve`` (docs/lm-eval.md).

    aiayn evaluate --checkpoint DIR --lm-eval aiayn_mc,hellaswag [--include-path DIR]

Importing this module registers the model with lm-eval (an optional dependency:
``pip install "lm-eval"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from aiayn.data.tokenizer import BPETokenizer, Tokenizer
from aiayn.errors import UserError
from aiayn.generate import SamplingConfig, generate
from aiayn.models import DecoderLM

GREEDY = SamplingConfig(temperature=0)


def _end_id(tokenizer: Tokenizer) -> int | None:
    """The end-of-text id lm-eval conditions an empty context on (the tokenizer's EOS)."""
    if isinstance(tokenizer, BPETokenizer):
        name = tokenizer.special_tokens.get("eos_token")
        if name is not None:
            found = tokenizer.tok.token_to_id(name)
            return None if found is None else int(found)
    return None


@register_model("aiayn")
class AiaynLM(TemplateLM):
    """An aiayn ``DecoderLM`` and its tokenizer, scored by lm-eval.
    ``max_length`` is the longest window read at once (default: the model's ``max_len``)."""

    def __init__(
        self,
        model: DecoderLM,
        tokenizer: Tokenizer,
        *,
        batch_size: int = 8,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        self.model, self.tok = model.eval(), tokenizer
        self.batch_size = batch_size
        self._max_length = max_length or model.config.max_len
        self._eot = _end_id(tokenizer)

    @classmethod
    def from_checkpoint(cls, checkpoint: str, **kwargs: Any) -> AiaynLM:
        from aiayn.checkpoint import load

        bundle = load(checkpoint)
        if not isinstance(bundle.model, DecoderLM):
            raise UserError(
                f"{checkpoint} holds a {type(bundle.model).__name__}: lm-eval scores language"
                " models (decoder-only)"
            )
        return cls(bundle.model, bundle.tokenizer, **kwargs)

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def eot_token_id(self) -> int:
        if self._eot is None:
            raise UserError("this tokenizer has no end-of-text token for an empty context")
        return self._eot

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **_: Any
    ) -> list[int]:
        if isinstance(self.tok, BPETokenizer) and not add_special_tokens:
            return list(self.tok.tok.encode(string, add_special_tokens=False).ids)
        return self.tok.encode(string)

    @torch.no_grad()
    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], **_: Any
    ) -> list[tuple[float, bool]]:
        """Each continuation's summed log-probability after its context, and whether it is
        the greedy one; the context is cut from the left to fit ``max_length`` tokens."""
        out: list[tuple[float, bool]] = []
        for _, context, continuation in requests:
            ids = [*context, *continuation][-(self.max_length + 1) :][:-1]
            logits = self.model(torch.tensor([ids]))[0, -len(continuation) :].float()
            lp = logits.log_softmax(-1)  # (C, V)
            target = torch.tensor(continuation)
            total = float(lp.gather(-1, target[:, None]).sum())
            out.append((total, bool((lp.argmax(-1) == target).all())))
        return out

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """A document's log-likelihood in windows of ``max_length`` tokens, each conditioned on
        the end of the one before (lm-eval's rolling windows, as its ``hf`` model reads them)."""
        from lm_eval import utils

        out = []
        for (text,) in (r.args for r in requests):
            windows = utils.get_rolling_token_windows(
                token_list=self.tok_encode(text),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            pairs = [(None, *utils.make_disjoint_window(w)) for w in windows]
            out.append(sum(score for score, _ in self._loglikelihood_tokens(pairs)))
        return out

    @torch.no_grad()
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy text after each context, cut at the first of its ``until`` strings."""
        return [self._generate(context, kwargs) for context, kwargs in (r.args for r in requests)]

    def _generate(self, context: str, kwargs: dict[str, Any]) -> str:
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        new = int(kwargs.get("max_gen_toks", 256))
        ids = self.tok_encode(context)[-(self.max_length - new) :]
        made = generate(
            self.model,
            [ids],
            max_new_tokens=new,
            sampling=GREEDY,
            eos_id=self._eot,
            stop=until,
            decode=self.tok.decode,
        )[0]
        if self._eot is not None and made and made[-1] == self._eot:
            made = made[:-1]
        return _cut(self.tok.decode(made), until)


def _cut(text: str, until: Sequence[str]) -> str:
    """``text`` up to the first of the stop strings."""
    ends = [text.find(s) for s in until if s and s in text]
    return text[: min(ends)] if ends else text


def _task_manager(include_path: str | None, tasks: list[str]) -> Any:
    """lm-eval's task index: only ``include_path``'s tasks when they are all there (indexing
    lm-eval's thousands of built-in tasks takes seconds), else those and the built-in ones."""
    from lm_eval.tasks import TaskManager

    if include_path is not None:
        local = TaskManager(include_path=include_path, include_defaults=False)
        if set(tasks) <= set(local.all_tasks):
            return local
    return TaskManager(include_path=include_path)


def evaluate_tasks(
    model: AiaynLM, tasks: list[str], *, include_path: str | None = None, limit: int | None = None
) -> dict[str, Any]:
    """lm-eval's results for ``tasks`` (its task names, and those of ``include_path``)."""
    import lm_eval

    manager = _task_manager(include_path, tasks)
    results = lm_eval.simple_evaluate(
        model=model, tasks=tasks, task_manager=manager, limit=limit, log_samples=True
    )
    if results is None:
        raise UserError(f"lm-eval gave no results for {tasks}")
    return results
