"""``aiayn serve --api-key``: bearer tokens, as OpenAI's clients send them.

With a key set, every ``/v1/...`` request must carry ``Authorization: Bearer KEY``; one
without it, or with another key, is a 401 in OpenAI's error shape.  ``/health`` and
``/metrics`` stay open: load balancers and Prometheus probe them without credentials.  Keys
are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from starlette.responses import Response

from aiayn.serve.errors import error_response


def require_api_key(app: FastAPI, key: str) -> None:
    """Refuse ``/v1/...`` requests that do not carry ``key`` as their bearer token."""
    if not key:
        raise ValueError("api_key is empty: give a non-empty key, or none to serve openly")
    expected = f"Bearer {key}".encode()

    @app.middleware("http")
    async def check(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                message = (
                    "missing API key: send the header 'Authorization: Bearer KEY'"
                    if not given
                    else "incorrect API key"
                )
                return error_response(401, message, "invalid_request_error")
        return await call_next(request)
