"""``POST /v1/completions``: OpenAI's (legacy) completions, as vLLM serves them.

A request holds one prompt or a batch (a list of strings, or of token-id lists), and asks for
``n`` choices of each -- drawn as ``best_of`` and the ``n`` with the highest cumulative
log-probability kept, when ``best_of`` is larger.  The choices are indexed as OpenAI indexes
them: prompt ``p``'s ``j``-th choice is ``p * n + j``.  ``logprobs`` (0-20) adds each token's
log-probability and the top ones (aiayn/serve/logprobs.py); ``echo`` puts the prompt before
the reply, in the text and in the log-probabilities, and with ``max_tokens: 0`` scores the
prompt alone -- what lm-evaluation-harness's ``local-completions`` asks for every
log-likelihood task.  ``suffix`` (insertion) is refused by name.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Any

from fastapi import Request
from pydantic import Field

from aiayn.serve.completion import (
    Choice,
    Completer,
    NonEmpty,
    SamplingBody,
    Shared,
    TokenIds,
    seeds,
    usage,
)
from aiayn.serve.engine import Event
from aiayn.serve.engine import Request as EngineRequest
from aiayn.serve.errors import APIError
from aiayn.serve.limits import MAX_LOGPROBS
from aiayn.serve.logprobs import completion_logprobs


class CompletionBody(SamplingBody):
    """OpenAI's completion request: the fields served, ``suffix`` refused, any other ignored."""

    prompt: str | NonEmpty[str] | TokenIds | NonEmpty[TokenIds]  # text, or token ids
    max_tokens: Annotated[int, Field(ge=0)] = 16
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool = False
    best_of: Annotated[int, Field(ge=1)] | None = None
    suffix: str | None = None

    def draws(self) -> int:
        """Choices drawn per prompt: ``best_of``, or ``n``."""
        return self.best_of or self.n


def _check(body: CompletionBody, prompts: int, completer: Completer) -> None:
    if body.suffix:
        raise APIError(400, "suffix: insertion is not supported by this server")
    if body.best_of is not None and body.best_of < body.n:
        raise APIError(400, f"best_of={body.best_of}: at least n={body.n}")
    if body.best_of is not None and body.best_of > body.n and body.stream:
        raise APIError(400, "best_of > n: cannot be streamed (the best are known at the end)")
    if body.max_tokens == 0 and not body.echo:
        raise APIError(400, "max_tokens=0: only with echo (scoring the prompt)")
    completer.check_choices(prompts * body.draws(), "n or best_of, times the prompts")


async def prompts_of(prompt: Any, completer: Completer) -> list[list[int]]:
    """The request's prompts as token ids: text is tokenized off the event loop, ids are
    taken as they are (and checked by ``Completer.check``)."""
    one = isinstance(prompt, str) or isinstance(prompt[0], int)
    prompts: list[Any] = [prompt] if one else list(prompt)
    return [p if isinstance(p, list) else await completer.encode(p) for p in prompts]


def choices_of(body: CompletionBody, prompts: list[list[int]]) -> list[Choice]:
    """The engine requests: ``draws()`` per prompt, each with its own seed.  ``best_of``
    ranks by log-probability, so those choices record it even when the client did not ask."""
    ranked = body.draws() > body.n
    logprobs = body.logprobs if body.logprobs is not None else (0 if ranked else None)
    return [
        Choice(ids, body.max_tokens, seed, logprobs, body.echo)
        for p, ids in enumerate(prompts)
        for seed in seeds(None if body.seed is None else body.seed + p * body.draws(), body.draws())
    ]


def kept(body: CompletionBody, requests: list[EngineRequest]) -> list[EngineRequest]:
    """The ``n`` returned per prompt: with ``best_of``, those of the highest cumulative
    log-probability, in that order."""
    draws = body.draws()
    out = []
    for start in range(0, len(requests), draws):
        group = requests[start : start + draws]
        if draws > body.n:
            group = sorted(group, key=lambda r: r.cumulative_logprob, reverse=True)[: body.n]
        out += group
    return out


async def text_completion(
    body: CompletionBody, http: Request, completer: Completer, name: str
) -> Any:
    """The handler (module docstring)."""
    prompts = await prompts_of(body.prompt, completer)
    _check(body, len(prompts), completer)
    for ids in prompts:  # every prompt against the limits
        stops = completer.check(ids, body.max_tokens, body.top_k, body.stop)
    shared = Shared(body.sampling(), stops, body.penalties(completer.vocab))
    requests, events = completer.submit(choices_of(body, prompts), shared)
    answer = Answer(body, completer, name, sum(len(ids) for ids in prompts))
    if not body.stream:
        await completer.wait(requests, events, http)
        return await answer.whole(kept(body, requests), requests)
    return completer.stream(requests, events, answer.chunks(requests), answer.closing(requests))


class Answer:
    """The response's JSON: whole, or as stream chunks."""

    def __init__(self, body: CompletionBody, completer: Completer, name: str, prompt: int) -> None:
        self.body, self.decode, self.prompt_tokens = body, completer.tokenizer.decode, prompt
        self.head = {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
        }

    async def whole(
        self, returned: list[EngineRequest], every: list[EngineRequest]
    ) -> dict[str, Any]:
        """Decoding (the echoed prompts, the tokens' text) runs off the event loop."""
        choices = await asyncio.to_thread(
            lambda: [self._choice(i, r) for i, r in enumerate(returned)]
        )
        return {**self.head, "choices": choices, "usage": usage(self.prompt_tokens, every)}

    def _choice(self, index: int, r: EngineRequest) -> dict[str, Any]:
        prefix = self.decode(r.prompt) if self.body.echo else ""
        logprobs = None
        if self.body.logprobs is not None:
            logprobs = completion_logprobs(r, self.decode, echo=self.body.echo)
        return {
            "text": prefix + r.text,
            "index": index,
            "logprobs": logprobs,
            "finish_reason": r.finish_reason,
        }

    def chunks(self, requests: list[EngineRequest]) -> Any:
        """Each event as a chunk of its choice; with ``echo``, a choice's first chunk carries
        its prompt."""
        started: set[int] = set()

        def chunks(index: int, event: Event) -> list[dict[str, Any]]:
            text = event.text
            if self.body.echo and index not in started:
                text = self.decode(requests[index].prompt) + text
            started.add(index)
            done = event.kind == "done"
            choice = {
                "text": text,
                "index": index,
                "logprobs": self._streamed_logprobs(event),
                "finish_reason": event.finish_reason if done else None,
            }
            return [{**self.head, "choices": [choice]}]

        return chunks

    def _streamed_logprobs(self, event: Event) -> dict[str, Any] | None:
        if self.body.logprobs is None or event.logprob is None or event.token is None:
            return None
        text = self.decode([event.token])
        top = {self.decode([i]): v for i, v in (event.top or {}).items()}
        return {
            "tokens": [text],
            "token_logprobs": [event.logprob],
            "top_logprobs": [top],
            "text_offset": [0],
        }

    def closing(self, requests: list[EngineRequest]) -> Any:
        """OpenAI's last chunk with ``stream_options.include_usage``: no choices, the usage."""

        def closing() -> list[dict[str, Any]]:
            if not self.body.include_usage():
                return []
            return [{**self.head, "choices": [], "usage": usage(self.prompt_tokens, requests)}]

        return closing
