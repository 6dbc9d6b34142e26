"""Log-probabilities in OpenAI's two shapes, from what the engine recorded.

Every value is the model's own ``log_softmax`` for the token at its prefix, before the
penalties, the logit bias, the temperature and the top-k / top-p filters, as vLLM reports them
(and as lm-evaluation-harness needs them: a score of the text, not of the sampler).  Tokens
are shown as their text (``decode([id])``); two ids with the same text share one entry of a
top-log-probabilities dict, as in vLLM.

* completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, the prompt's
  tokens first with ``echo`` (the first with ``null``: nothing predicts it);
* chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aiayn.serve.engine import Request as EngineRequest

Decode = Callable[[list[int]], str]


def completion_logprobs(
    r: EngineRequest, decode: Decode, *, echo: bool, offset: int = 0
) -> dict[str, Any]:
    """The completions API's ``logprobs`` of ``r`` (its prompt's first with ``echo``); text
    offsets count from ``offset``."""
    ids: list[int] = list(r.tokens)
    values: list[float | None] = list(r.token_logprobs)
    tops: list[dict[int, float] | None] = list(r.top_logprobs)
    if echo:
        ids, values, tops = [*r.prompt, *ids], [*r.prompt_logprobs, *values], [*r.prompt_top, *tops]
    tokens = [decode([i]) for i in ids]
    return {
        "tokens": tokens,
        "token_logprobs": values,
        "top_logprobs": [None if t is None else _by_text(t, decode) for t in tops],
        "text_offset": offsets(tokens, offset),
    }


def offsets(tokens: Sequence[str], start: int = 0) -> list[int]:
    """Each token's character offset: the lengths of the tokens before it, from ``start``."""
    out, at = [], start
    for token in tokens:
        out.append(at)
        at += len(token)
    return out


def _by_text(top: dict[int, float], decode: Decode) -> dict[str, float]:
    out: dict[str, float] = {}
    for i, value in top.items():
        text = decode([i])
        out[text] = max(value, out.get(text, float("-inf")))
    return out


def chat_logprobs(
    token_ids: Sequence[int],
    values: Sequence[float],
    tops: Sequence[dict[int, float]],
    decode: Decode,
) -> dict[str, Any]:
    """The chat API's ``logprobs``: one entry per generated token, with its top ones."""
    content = []
    for token, value, top in zip(token_ids, values, tops, strict=True):
        entry = _chat_entry(decode([token]), value)
        entry["top_logprobs"] = [_chat_entry(decode([i]), v) for i, v in top.items()]
        content.append(entry)
    return {"content": content}


def _chat_entry(text: str, value: float) -> dict[str, Any]:
    return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}
