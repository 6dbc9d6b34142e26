"""``aiayn explore``: a FastAPI app that serves the explorer page and its JSON API.

The page (``static/``) draws with Plotly.js, served from the ``plotly`` Python package's own
copy, so the explorer works offline.  Every number it shows comes from the endpoints below,
which call the library (the routers of ``aiayn/explore/routes/``):

========================  ======================================================================
``GET /api/models``       the configured models (names only: a request never names a file)
``POST /api/attention``   one layer's attention, re-weighted at a temperature, causal or not
``POST /api/next-token``  a language model's next-token distribution
``POST /api/translate``   a translation (beam search) for the alignment view
``POST /api/lesson/*``    the teaching views: ``query``, ``lookup``, ``positions``, ``kv-cache``
========================  ======================================================================

Bad requests get a 4xx answer with ``{"error": "..."}`` naming what was wrong, and the server
keeps serving: 400 malformed JSON (too deeply nested included) or a model named by a path, 404
an unknown model or path, 405 a wrong method, 413 a body over ``max_body`` bytes (refused from
its Content-Length, or as soon as a chunked body passes the limit, before it is read) or text
over the limit (characters, or the model's tokens), 422 a value out of range.  Anything
unexpected is a 500 with ``{"error": ...}`` too.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from aiayn.explore.errors import error, install_error_handlers
from aiayn.explore.registry import Registry
from aiayn.explore.routes import lessons, page, views
from aiayn.serve.body_limit import limit_body
from aiayn.serve.hosts import allowed_hosts as hosts_for
from aiayn.serve.hosts import check_hosts

DEFAULT_MAX_CHARS = 400
DEFAULT_MAX_BODY = 64 * 1024  # bytes of a request body


def create_app(
    registry: Registry, *, max_chars: int = DEFAULT_MAX_CHARS, max_body: int = DEFAULT_MAX_BODY
) -> FastAPI:
    """The explorer app over ``registry``; texts longer than ``max_chars`` and bodies larger
    than ``max_body`` bytes get a 413."""
    app = FastAPI(title="aiayn explorer", docs_url=None, redoc_url=None)
    limit_body(app, max_body, error)
    install_error_handlers(app)
    app.include_router(page.router())
    app.mount("/static", StaticFiles(directory=page.STATIC), name="static")
    app.include_router(views.router(registry, max_chars))
    app.include_router(lessons.router())
    return app


def serve(
    registry: Registry,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_body: int = DEFAULT_MAX_BODY,
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Run the explorer until interrupted, answering the ``Host`` names of
    ``aiayn.serve.hosts.allowed_hosts`` (the loopback names, and ``allowed_hosts``)."""
    import uvicorn

    app = create_app(registry, max_chars=max_chars, max_body=max_body)
    check_hosts(app, hosts_for(host, allowed_hosts))
    uvicorn.run(app, host=host, port=port, log_level="info")
