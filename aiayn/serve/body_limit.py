"""A request-body limit for the servers (``aiayn serve``, ``aiayn explore``): a body over
``max_bytes`` is a 413, refused before it is read -- so a 20 MB prompt is never parsed, let
alone tokenized."""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aiayn.errors import RequestError


def limit_body(app: Starlette, max_bytes: int, respond: Callable[[int, str], Response]) -> None:
    """Refuse ``app``'s request bodies over ``max_bytes`` (a ValueError names a limit below 1
    byte, when the app is built rather than at its first request)."""
    if max_bytes < 1:
        raise RequestError(f"max_body={max_bytes}: expected at least 1 byte")
    app.add_middleware(BodyLimit, max_bytes=max_bytes, respond=respond)


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is refused with 413 before it is read
    -- at once from its Content-Length, or as soon as a chunked body passes the limit.
    ``respond(status, message)`` is the server's error response (its JSON shape)."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, respond: Callable[[int, str], Response]
    ) -> None:
        self.app, self.max_bytes, self.respond = app, max_bytes, respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send, declared.decode(errors="replace"))
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(
                        413,
                        f"the request body is more than {self.max_bytes} bytes;"
                        f" this server accepts at most {self.max_bytes}",
                    )
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send, f"more than {self.max_bytes}")

    async def _refuse(self, send: Send, size: str) -> None:
        response = self.respond(
            413, f"the request body is {size} bytes; this server accepts at most {self.max_bytes}"
        )
        await response({"type": "http"}, _no_body, send)


class _TooLarge(HTTPException):
    """Raised while reading a body that passes the limit; FastAPI passes HTTPExceptions
    through its body parsing, so the handler answers 413 with this message."""


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
