"""``aiayn serve --api-key``: bearer tokens, as OpenAI's clients send them.

With a key set, every request must carry ``Authorization: Bearer KEY``; one without it, or
with another key, is a 401 in OpenAI's error shape.  Only ``/health`` and ``/metrics``, by
their exact paths, stay open: load balancers and Prometheus probe them without credentials.
Everything else is closed, so a path spelled another way (``//v1/models``,
``/v1/../v1/models``, ``/v1%2Fmodels``, a trailing slash) or the OpenAPI schema never slips
past the check.  Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from starlette.responses import Response

from aiayn.errors import RequestError
from aiayn.serve.errors import error_response

OPEN_PATHS = frozenset({"/health", "/metrics"})


def require_api_key(app: FastAPI, key: str) -> None:
    """Refuse every request but the probes' (``OPEN_PATHS``) that does not carry ``key``
    as its bearer token."""
    if not key:
        raise RequestError("api_key is empty: give a non-empty key, or none to serve openly")
    expected = f"Bearer {key}".encode()

    @app.middleware("http")
    async def check(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.scope["path"] not in OPEN_PATHS:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                message = (
                    "missing API key: send the header 'Authorization: Bearer KEY'"
                    if not given
                    else "incorrect API key"
                )
                return error_response(401, message, "invalid_request_error")
        return await call_next(request)
