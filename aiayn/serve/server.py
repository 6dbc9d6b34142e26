"""The life of ``aiayn serve``'s process: the HTTP server on a thread of its own, the engine
in the calling (main) thread (see ``Engine.run``), and one orderly stop for both on
Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence

import uvicorn
from fastapi import FastAPI

from aiayn.serve.engine import Engine
from aiayn.serve.hosts import allowed_hosts as hosts_for
from aiayn.serve.hosts import check_hosts


def run_server(
    app: FastAPI,
    *,
    host: str,
    port: int,
    log_level: str,
    label: str,
    allowed_hosts: Sequence[str] = (),
) -> None:
    """Serve ``app`` (made by ``create_app(..., start_engine=False)``) on ``host``:``port``
    until Ctrl-C or SIGTERM, running its engine in this thread; ``label`` names what is served
    in the line printed once the port is open.  It answers the ``Host`` names of
    ``aiayn.serve.hosts.allowed_hosts`` (``allowed_hosts`` added).  An ``OSError`` if the
    port cannot be served."""
    check_hosts(app, hosts_for(host, allowed_hosts))
    # On shutdown the engine stops first and every open stream hears an error event and ends,
    # so uvicorn's graceful shutdown (which also runs the app's lifespan to its end) is quick;
    # the timeout bounds it should a client hold its connection open.  A forced exit instead
    # cancels the lifespan and logs a traceback for an ordinary Ctrl-C.
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    )
    engine: Engine | None = app.state.engine

    def http_server() -> None:
        try:
            server.run()
        finally:  # uvicorn gave up (a port in use exits its thread): stop the engine too
            if engine is not None:
                engine.stop(wait=False)

    def terminate(signum: int, frame: object) -> None:  # SIGTERM (docker stop, systemd): as Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    http = threading.Thread(target=http_server, name="aiayn-http", daemon=True)
    http.start()
    try:
        _serve_until_stopped(server, http, engine, f"{host}:{port}", label)
    except KeyboardInterrupt:
        pass
    finally:
        if engine is not None:
            engine.stop()  # first: the open streams end with an error event
        server.should_exit = True
        http.join(10)
        signal.signal(signal.SIGTERM, previous)
        print("aiayn serve: stopped", file=sys.stderr)


def _serve_until_stopped(
    server: uvicorn.Server, http: threading.Thread, engine: Engine | None, address: str, label: str
) -> None:
    """Wait for the HTTP server to listen, say so, then run the engine (or, for translation
    and embeddings, whose requests run on the server's worker threads, wait) until Ctrl-C."""
    while not server.started and http.is_alive():
        http.join(0.05)
    if not server.started:
        raise OSError(f"could not serve on {address} (see the message above)")
    pool = "" if engine is None else f", KV pool {engine.pool.nbytes() / 2**20:.0f} MiB"
    print(f"serving {label} on http://{address}/{pool}", file=sys.stderr)
    if engine is None:
        while http.is_alive():
            http.join(0.5)
    else:
        engine.run()  # until Ctrl-C
