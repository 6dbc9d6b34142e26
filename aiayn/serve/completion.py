"""What ``/v1/completions`` and ``/v1/chat/completions`` share: the sampling fields of a
request, checking it against the server's limits, handing its choices to the engine, and
waiting for their tokens -- all at once, or as server-sent events.

One HTTP request is one or more engine requests (its *choices*: ``n`` per prompt, ``best_of``
drawn to keep ``n``, one set per prompt of a batch).  Their tokens come from the engine's
thread as ``Event`` s, tagged with the choice's index, through one
asyncio queue.  A client that disconnects cancels them all, and the engine frees their rows at
the next step: a streaming client when its stream closes, a waiting one when the server looks
(every quarter second, tokens or not).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.generate.penalties import Penalties
from aiayn.generate.sampling import SamplingConfig
from aiayn.serve.engine import Engine, Event
from aiayn.serve.engine import Request as EngineRequest
from aiayn.serve.errors import INTERNAL_ERROR, APIError
from aiayn.serve.limits import MAX_N, MAX_STOP_CHARS, MAX_STOPS

log = logging.getLogger(__name__)

Tagged = tuple[int, Event]  # an event of the choice with this index
Chunks = Callable[[int, Event], Iterable[dict[str, Any]]]  # an event as the stream's chunks
T = TypeVar("T")
NonEmpty = Annotated[list[T], Field(min_length=1)]
TokenIds = NonEmpty[Annotated[int, Field(ge=0)]]  # a prompt as token ids
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class SamplingBody(BaseModel):
    """The fields OpenAI's completion and chat requests share: how to sample, how many
    choices, where to stop, whether to stream.  Fields neither serves are ignored.  Values are
    taken as their JSON types say (``strict``): ``true`` is not a number, ``"5"`` not an
    integer."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=10.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=1)] | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1)] = 1
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, Bias] | None = None
    user: str | None = None  # accepted, and not used

    def sampling(self) -> SamplingConfig:
        top_p = None if self.top_p >= 1.0 else self.top_p
        return SamplingConfig(temperature=self.temperature, top_p=top_p, top_k=self.top_k)

    def penalties(self, vocab: int) -> Penalties:
        """The penalties and the logit bias; a bias key that is not a token id is a 400."""
        bias = {}
        for key, value in (self.logit_bias or {}).items():
            if not key.isdigit() or int(key) >= vocab:
                raise APIError(400, f"logit_bias: {key!r} is not a token id (0 to {vocab - 1})")
            bias[int(key)] = value
        return Penalties(self.presence_penalty, self.frequency_penalty, bias)

    def include_usage(self) -> bool:
        """Whether a stream ends with OpenAI's usage chunk (``stream_options``)."""
        return self.stream_options is not None and self.stream_options.include_usage


@dataclass(frozen=True)
class Choice:
    """One engine request of an HTTP request: its prompt, its seed, what it records."""

    ids: list[int]
    max_tokens: int
    seed: int | None = None
    logprobs: int | None = None
    echo: bool = False


@dataclass(frozen=True)
class Shared:
    """What every choice of an HTTP request shares."""

    sampling: SamplingConfig
    stops: list[str]
    penalties: Penalties = field(default_factory=Penalties)


def seeds(seed: int | None, count: int) -> list[int | None]:
    """The seeds of ``count`` choices: ``seed``, ``seed + 1``, ... (each choice its own
    independent draw, reproducible), or none."""
    return [None if seed is None else (seed + i) % 2**63 for i in range(count)]


@dataclass(frozen=True)
class Limits:
    """What one request may ask: ``context`` tokens in all, prompts of at most ``prompt``
    tokens, at most ``new`` new ones, stop strings of at most ``stop_chars`` characters, at
    most ``choices`` engine requests (``n`` or ``best_of``, times the prompts of a batch)."""

    context: int
    prompt: int
    new: int
    stop_chars: int = MAX_STOP_CHARS
    choices: int = MAX_N


class Completer:
    """The engine behind the completion endpoints, with the server's ``Limits``.  Text is
    tokenized on a worker thread (``encode``): the event loop never waits on a long
    prompt."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, vocab: int, limits: Limits) -> None:
        self.engine, self.tokenizer, self.vocab, self.limits = engine, tokenizer, vocab, limits

    @property
    def context(self) -> int:
        return self.limits.context

    @property
    def new_limit(self) -> int:
        return self.limits.new

    async def encode(self, text: str) -> list[int]:
        """``text`` as token ids, tokenized off the event loop; a 400 for text the tokenizer
        cannot take (a character outside a character-level vocabulary)."""
        try:
            return await asyncio.to_thread(self.tokenizer.encode, text)
        except UserError as err:
            raise APIError(400, f"prompt: {err}") from None

    def check(self, ids: list[int], max_tokens: int, top_k: int | None, stop: Any) -> list[str]:
        """Raise a 400 naming what breaks a limit; return the stop strings as a list."""
        self._check_prompt(ids)
        self._check_length(len(ids), max_tokens)
        if top_k is not None and top_k > self.vocab:
            raise APIError(400, f"top_k={top_k}: the vocabulary has {self.vocab} tokens")
        return self._stops(stop)

    def check_choices(self, count: int, what: str) -> None:
        """A 400 for a request of more than ``Limits.choices`` engine requests."""
        if count > self.limits.choices:
            raise APIError(
                400,
                f"{what}: {count} choices; this server makes at most {self.limits.choices}"
                " per request (max_n)",
            )

    def _check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise APIError(400, "prompt: empty (it must have at least one token)")
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            last = self.vocab - 1
            raise APIError(
                400, f"prompt: token id {bad[0]} is outside the vocabulary (0 to {last})"
            )
        if len(ids) > self.limits.prompt:
            raise APIError(
                400,
                f"prompt: {len(ids)} tokens; this server takes at most {self.limits.prompt}"
                f" (max_prompt_tokens; context {self.context})",
            )

    def _check_length(self, prompt: int, max_tokens: int) -> None:
        if max_tokens > self.limits.new:
            raise APIError(400, f"max_tokens={max_tokens}: at most {self.limits.new}")
        if prompt + max_tokens > self.context:
            raise APIError(
                400,
                f"prompt ({prompt} tokens) + max_tokens ({max_tokens}) exceed the context of"
                f" {self.context} tokens",
            )

    def _stops(self, stop: Any) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOPS or any(not s for s in stops):
            raise APIError(400, f"stop: up to {MAX_STOPS} non-empty strings")
        longest = max((len(s) for s in stops), default=0)
        if longest > self.limits.stop_chars:
            raise APIError(
                400,
                f"stop: a string of {longest} characters; this server takes at most"
                f" {self.limits.stop_chars} (max_stop_chars)",
            )
        return stops

    def submit(
        self, choices: Sequence[Choice], shared: Shared
    ) -> tuple[list[EngineRequest], asyncio.Queue[Tagged]]:
        """Queue the choices with the engine; their events arrive, tagged with the choice's
        index, on the returned queue.  A full queue cancels those already queued."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Tagged] = asyncio.Queue()
        requests: list[EngineRequest] = []
        try:
            for index, c in enumerate(choices):
                emit = _emitter(loop, events, index)
                request = EngineRequest(
                    c.ids,
                    c.max_tokens,
                    shared.sampling,
                    c.seed,
                    shared.stops,
                    emit,
                    logprobs=c.logprobs,
                    echo=c.echo,
                    penalties=shared.penalties,
                )
                self.engine.submit(request)
                requests.append(request)
        except Exception:
            cancel_all(requests)
            raise
        return requests, events

    @staticmethod
    async def wait(
        requests: list[EngineRequest], events: asyncio.Queue[Tagged], http: Request
    ) -> None:
        """Until every choice is done; a client gone meanwhile cancels them (a 499)."""
        pending = len(requests)
        try:
            checked = time.monotonic()
            while pending:
                try:
                    tagged: Tagged | None = await asyncio.wait_for(events.get(), timeout=0.25)
                except TimeoutError:
                    tagged = None
                # Whether the client is still there, every quarter second whether or not
                # tokens arrive (they arrive every few ms): a client that gave up must not
                # hold its rows until max_tokens.
                if time.monotonic() - checked >= 0.25:
                    checked = time.monotonic()
                    if await http.is_disconnected():
                        cancel_all(requests)
                        raise APIError(499, "client closed the request")
                if tagged is None:
                    continue
                _, event = tagged
                if event.kind == "error":
                    cancel_all(requests)
                    raise failed(event)
                pending -= event.kind == "done"
        except asyncio.CancelledError:
            cancel_all(requests)
            raise

    @staticmethod
    def stream(
        requests: list[EngineRequest],
        events: asyncio.Queue[Tagged],
        chunks: Chunks,
        closing: Callable[[], Iterable[dict[str, Any]]] = lambda: (),
    ) -> StreamingResponse:
        """Server-sent events: ``chunks(index, event)`` for each token and each choice's end,
        then ``closing()`` (a usage chunk), then ``data: [DONE]``."""

        async def sse() -> AsyncIterator[str]:
            pending = len(requests)
            try:
                while pending:
                    index, event = await events.get()
                    if event.kind == "error":
                        message = failed(event).message
                        yield f"data: {json.dumps({'error': {'message': message}})}\n\n"
                        return
                    if event.kind == "token" and not event.text and event.logprob is None:
                        continue
                    for chunk in chunks(index, event):
                        yield f"data: {json.dumps(chunk)}\n\n"
                    pending -= event.kind == "done"
                for chunk in closing():
                    yield f"data: {json.dumps(chunk)}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                cancel_all(requests)  # a no-op once finished; frees the rows if the client left

        # The cancel also runs as a background task: a client gone before the first event
        # never enters sse()'s finally.
        return StreamingResponse(
            sse(),
            media_type="text/event-stream",
            background=BackgroundTask(cancel_all, requests),
        )


def _emitter(
    loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Tagged], index: int
) -> Callable[[Event], None]:
    def emit(event: Event) -> None:
        loop.call_soon_threadsafe(events.put_nowait, (index, event))

    return emit


def cancel_all(requests: Iterable[EngineRequest]) -> None:
    for request in requests:
        request.cancel()


def failed(event: Event) -> APIError:
    """A request the engine failed, as the client hears it: a 500 without the engine's
    message, which goes to the log."""
    log.error("a request failed in the engine: %s", event.text)
    return APIError(500, INTERNAL_ERROR, "server_error")


def usage(prompt_tokens: int, requests: Iterable[EngineRequest]) -> dict[str, int]:
    """OpenAI's usage: each prompt counted once, every choice's tokens (best_of's too)."""
    made = sum(len(r.tokens) for r in requests)
    total = prompt_tokens + made
    return {"prompt_tokens": prompt_tokens, "completion_tokens": made, "total_tokens": total}
