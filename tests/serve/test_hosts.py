"""DNS rebinding: a server bound to loopback answers only loopback names and those allowed;
``aiayn serve`` and ``aiayn explore`` install the check."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from aiayn.cli import main
from aiayn.serve.hosts import allowed_hosts, check_hosts, host_name


def test_the_names_a_bound_address_answers() -> None:
    assert allowed_hosts("127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts("::1", ["My.Box"]) == {"localhost", "127.0.0.1", "::1", "my.box"}
    assert allowed_hosts("localhost") == allowed_hosts("127.0.0.2")
    assert allowed_hosts("0.0.0.0") is None  # any name: a reverse proxy checks them
    assert allowed_hosts("0.0.0.0", ["api.example"]) == {"api.example"}
    headers = ("[::1]:8000", "[::1]", "LocalHost:80", "::1", "a.b")
    assert [host_name(h) for h in headers] == ["::1", "::1", "localhost", "::1", "a.b"]


def test_a_rebound_name_is_refused_and_loopback_names_are_answered() -> None:
    app = FastAPI()
    app.get("/health")(lambda: {"ok": True})
    check_hosts(app, allowed_hosts("127.0.0.1", ["box.lan"]))
    with TestClient(app) as client:
        for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "box.lan"):
            assert client.get("/health", headers={"host": host}).status_code == 200, host
        r = client.get("/health", headers={"host": "evil.example:8000"})
        assert r.status_code == 400
        assert "--allowed-host evil.example" in r.json()["error"]["message"]


@pytest.mark.parametrize("command", ["serve", "explore"])
def test_the_commands_install_the_check(
    command: str, lm_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app each command serves, bound to loopback (the default): a foreign Host is refused,
    a name given with --allowed-host is answered.  uvicorn is replaced by a stand-in that keeps
    the app and returns at once (so serve ends with 'could not serve', exit 2)."""
    import uvicorn

    apps: list[FastAPI] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a: apps.append(self.config.app))
    main([command, "--checkpoint", str(lm_checkpoint), "--allowed-host", "box.lan"])
    assert len(apps) == 1
    with TestClient(apps[0]) as client:
        assert client.get("/health", headers={"host": "evil.example"}).status_code == 400
        assert client.get("/health", headers={"host": "box.lan"}).status_code != 400
