"""The ``Host`` names a server answers: a defence against DNS rebinding.

A page on another site can make a browser send requests to ``127.0.0.1:8000`` under a name the
attacker controls (its DNS first points at the attacker, then at 127.0.0.1): the browser's
same-origin rule then lets the page read the answers.  The one thing such a request cannot
fake is its ``Host`` header, which carries the attacker's name.  So a server bound to a loopback
address answers only the loopback names (``localhost``, ``127.0.0.1``, ``::1``) and those given
with ``--allowed-host``; bound to another address, it answers the names given, or any name when
none is (behind a reverse proxy, which checks them).  ``aiayn serve`` and ``aiayn explore``
both use it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Sequence

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def allowed_hosts(bind: str, extra: Sequence[str] = ()) -> frozenset[str] | None:
    """The names a server bound to ``bind`` answers (None: any name)."""
    names = frozenset(name.strip().lower() for name in extra)
    if _is_loopback(bind):
        return LOOPBACK_NAMES | names
    return names or None


def _is_loopback(bind: str) -> bool:
    if bind.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:  # a name: loopback only if it is "localhost"
        return False


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port: ``[::1]:8000`` -> ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 address, with or without a port
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def check_hosts(app: FastAPI, allowed: frozenset[str] | None) -> None:
    """Answer only requests whose ``Host`` is one of ``allowed`` (None: any): the others get a
    400 that names the header and the flag that would admit it."""
    if allowed is None:
        return

    @app.middleware("http")
    async def check(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        name = host_name(request.headers.get("host", ""))
        if name not in allowed:
            message = (
                f"Host {name!r} is not served here (DNS rebinding is refused); start the server"
                f" with --allowed-host {name or 'NAME'} to answer it"
            )
            body = {"error": {"message": message, "type": "invalid_request_error", "code": 400}}
            return JSONResponse(body, status_code=400)
        return await call_next(request)
