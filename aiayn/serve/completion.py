"""What ``/v1/completions`` and ``/v1/chat/completions`` share: checking a request against the
server's limits, handing it to the engine, and waiting for its tokens -- all at once, or as
server-sent events.

A request's tokens come from the engine's thread as :class:`~aiayn.serve.engine.Event` s,
through an asyncio queue.  A client that disconnects cancels its request, and the engine frees
its row at the next step: a streaming client when its stream closes, a waiting one when the
server looks (every quarter second, tokens or not).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.background import BackgroundTask

from aiayn.data.tokenizer import Tokenizer
from aiayn.generate.sampling import SamplingConfig
from aiayn.serve.engine import Engine, Event
from aiayn.serve.engine import Request as EngineRequest
from aiayn.serve.errors import INTERNAL_ERROR, APIError
from aiayn.serve.limits import MAX_STOP_CHARS, MAX_STOPS

log = logging.getLogger(__name__)

Chunks = Callable[[Event], Iterable[dict[str, Any]]]  # an event as the stream's JSON chunks
T = TypeVar("T")
NonEmpty = Annotated[list[T], Field(min_length=1)]
TokenIds = NonEmpty[Annotated[int, Field(ge=0)]]  # a prompt as token ids


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class SamplingBody(BaseModel):
    """The fields OpenAI's completion and chat requests share: how to sample, where to stop,
    whether to stream.  Fields neither serves are ignored.  Values are taken as their JSON
    types say (``strict``): ``true`` is not a number, ``"5"`` not an integer."""

    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=10.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=1)] | None = None
    stop: str | list[str] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature,
                              top_p=None if self.top_p >= 1.0 else self.top_p,
                              top_k=self.top_k)  # fmt: skip

    def include_usage(self) -> bool:
        """Whether a stream ends with OpenAI's usage chunk (``stream_options``)."""
        return self.stream_options is not None and self.stream_options.include_usage


@dataclass(frozen=True)
class Limits:
    """What one request may ask: ``context`` tokens in all, prompts of at most ``prompt``
    tokens, at most ``new`` new ones, stop strings of at most ``stop_chars`` characters."""

    context: int
    prompt: int
    new: int
    stop_chars: int = MAX_STOP_CHARS


class Completer:
    """The engine behind the completion endpoints, with the server's :class:`Limits`.  Text is
    tokenized on a worker thread (:meth:`encode`): the event loop never waits on a long
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
        except ValueError as err:
            raise APIError(400, f"prompt: {err}") from None

    def check(self, ids: list[int], max_tokens: int, top_k: int | None, stop: Any) -> list[str]:
        """Raise a 400 naming what breaks a limit; return the stop strings as a list."""
        self._check_prompt(ids)
        self._check_length(len(ids), max_tokens)
        if top_k is not None and top_k > self.vocab:
            raise APIError(400, f"top_k={top_k}: the vocabulary has {self.vocab} tokens")
        return self._stops(stop)

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
        self, ids: list[int], max_tokens: int, sampling: SamplingConfig, seed: int | None,
        stops: list[str],
    ) -> tuple[EngineRequest, asyncio.Queue[Event]]:  # fmt: skip
        """Queue the request with the engine; its events arrive on the returned queue."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        request = EngineRequest(ids, max_tokens, sampling, seed, stops, emit)
        self.engine.submit(request)
        return request, events

    @staticmethod
    async def wait(request: EngineRequest, events: asyncio.Queue[Event], http: Request) -> None:
        """Until the request is done; a client gone meanwhile cancels it (a 499)."""
        try:
            checked = time.monotonic()
            while True:
                try:
                    event: Event | None = await asyncio.wait_for(events.get(), timeout=0.25)
                except TimeoutError:
                    event = None
                # Whether the client is still there, every quarter second whether or not
                # tokens arrive (they arrive every few ms): a client that gave up must not
                # hold its row until max_tokens.
                if time.monotonic() - checked >= 0.25:
                    checked = time.monotonic()
                    if await http.is_disconnected():
                        request.cancel()
                        raise APIError(499, "client closed the request")
                if event is None:
                    continue
                if event.kind == "error":
                    raise failed(event)
                if event.kind == "done":
                    return
        except asyncio.CancelledError:
            request.cancel()
            raise

    @staticmethod
    def stream(
        request: EngineRequest,
        events: asyncio.Queue[Event],
        chunks: Chunks,
        closing: Callable[[], Iterable[dict[str, Any]]] = lambda: (),
    ) -> StreamingResponse:
        """Server-sent events: ``chunks(event)`` for each token and for the end, then
        ``closing()`` (a usage chunk), then ``data: [DONE]``."""

        async def sse() -> AsyncIterator[str]:
            try:
                while True:
                    event = await events.get()
                    if event.kind == "error":
                        message = failed(event).message
                        yield f"data: {json.dumps({'error': {'message': message}})}\n\n"
                        break
                    if event.kind == "token" and not event.text:
                        continue
                    for chunk in chunks(event):
                        yield f"data: {json.dumps(chunk)}\n\n"
                    if event.kind == "done":
                        for chunk in closing():
                            yield f"data: {json.dumps(chunk)}\n\n"
                        yield "data: [DONE]\n\n"
                        break
            finally:
                request.cancel()  # a no-op once finished; frees the row if the client left

        # The cancel also runs as a background task: a client gone before the first event
        # never enters sse()'s finally.
        return StreamingResponse(
            sse(), media_type="text/event-stream", background=BackgroundTask(request.cancel)
        )


def failed(event: Event) -> APIError:
    """A request the engine failed, as the client hears it: a 500 without the engine's
    message, which goes to the log."""
    log.error("a request failed in the engine: %s", event.text)
    return APIError(500, INTERNAL_ERROR, "server_error")


def usage(prompt_tokens: int, request: EngineRequest) -> dict[str, int]:
    made = len(request.tokens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": made,
            "total_tokens": prompt_tokens + made}  # fmt: skip


class CompletionBody(SamplingBody):
    """OpenAI's completion request: the fields this server uses, those it refuses by name, and
    any other ignored."""

    prompt: str | NonEmpty[str] | TokenIds | NonEmpty[TokenIds]  # text, or token ids
    max_tokens: Annotated[int, Field(ge=1)] = 16
    # Accepted by OpenAI but not served here: refused by name rather than ignored, since a
    # client that asks for them reads fields this server would leave empty.
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None


async def text_completion(
    body: CompletionBody, http: Request, completer: Completer, name: str
) -> Any:
    """``POST /v1/completions``: one prompt (text or token ids) continued, at once or as
    server-sent events; the fields this server does not serve are refused by name."""
    unsupported = [
        f"{key}={value!r}"
        for key, value, default in (
            ("logprobs", body.logprobs, None), ("echo", body.echo, False),
            ("suffix", body.suffix, None), ("best_of", body.best_of, 1),
        )
        if value is not None and value != default
    ]  # fmt: skip
    if unsupported:
        raise APIError(400, f"{', '.join(unsupported)}: not supported by this server")
    ids = await prompt_ids(body.prompt, completer)
    stops = completer.check(ids, body.max_tokens, body.top_k, body.stop)
    request, events = completer.submit(ids, body.max_tokens, body.sampling(), body.seed, stops)
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
            "created": int(time.time()), "model": name}  # fmt: skip
    if not body.stream:
        await completer.wait(request, events, http)
        choice = {"text": request.text, "index": 0, "logprobs": None,
                  "finish_reason": request.finish_reason}  # fmt: skip
        return {**head, "choices": [choice], "usage": usage(len(ids), request)}

    def chunks(event: Event) -> list[dict[str, Any]]:
        done = event.kind == "done"
        choice = {"text": event.text, "index": 0, "logprobs": None,
                  "finish_reason": event.finish_reason if done else None}  # fmt: skip
        return [{**head, "choices": [choice]}]

    def closing() -> list[dict[str, Any]]:  # OpenAI's last chunk: no choices, the usage
        if not body.include_usage():
            return []
        return [{**head, "choices": [], "usage": usage(len(ids), request)}]

    return completer.stream(request, events, chunks, closing)


async def prompt_ids(prompt: Any, completer: Completer) -> list[int]:
    """A completion's one prompt as token ids (text is tokenized off the event loop; ids are
    taken as they are, and checked against the vocabulary by :meth:`Completer.check`)."""
    one = isinstance(prompt, str) or (prompt and isinstance(prompt[0], int))
    prompts: list[Any] = [prompt] if one else list(prompt)
    if len(prompts) != 1:
        raise APIError(400, f"prompt: give one prompt per request (got {len(prompts)})")
    if not isinstance(prompts[0], str):
        return list(prompts[0])
    return await completer.encode(prompts[0])
