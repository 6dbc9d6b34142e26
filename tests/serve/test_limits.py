"""Hostile requests: every request's work is bounded and none stalls the others.

Each test reproduces an attack on the server -- a body too large to read, a stop string long
enough to slow every step, a prompt whose tokenization holds the event loop, a client that
leaves a translation or an embedding job running, a queue filled past its limit, an error that
tells the client the server's internals -- and checks the server's answer.  Counts, not
clocks: a job held at its first step shows how many steps it made after its client left.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx2 as httpx
import pytest
from fastapi.testclient import TestClient

from aiayn.data.tokenizer import CharTokenizer
from aiayn.generate.cancel import CancelToken
from aiayn.models import EncoderLM
from aiayn.serve.app import create_app
from aiayn.serve.engine import QueueFull
from aiayn.serve.errors import INTERNAL_ERROR
from aiayn.serve.jobs import JobQueue
from aiayn.serve.limits import MAX_STOP_CHARS
from tests.conftest import tiny_model
from tests.serve.support import served, wait_until
from tests.serve.test_app import client, lm_and_tokenizer, metrics, mt_and_tokenizer


def test_a_body_over_the_limit_is_a_413_and_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared (Content-Length) or streamed in chunks without one, a body over ``max_body``
    is refused before the route reads it: the prompt is never tokenized."""
    m, tok = lm_and_tokenizer()
    tokenized: list[str] = []
    encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text: tokenized.append(text) or encode(text))
    prompt = "the lazy dog " * 200  # 2,600 characters
    body = json.dumps({"prompt": prompt, "max_tokens": 1}).encode()
    with TestClient(create_app(m, tok, name="tiny", max_body=1000)) as c:
        declared = c.post("/v1/completions", content=body)
        chunked = c.post("/v1/completions", content=iter([body[:600], body[600:]]))
        small = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
    for r in (declared, chunked):
        assert r.status_code == 413, r.text
        assert "at most 1000" in r.json()["error"]["message"]
    assert small.status_code == 200, small.text
    assert tokenized == ["a"]


def test_stop_strings_longer_than_the_limit_are_refused() -> None:
    long = "x" * (MAX_STOP_CHARS + 1)
    with client() as (c, _, _):
        r = c.post("/v1/completions", json={"prompt": "a", "stop": ["ok", long]})
        assert r.status_code == 400
        assert f"{MAX_STOP_CHARS + 1} characters" in r.json()["error"]["message"]
        assert "max_stop_chars" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "stop": long[:-1]})
        assert r.status_code == 200, r.text
    with client(max_stop_chars=8) as (c, _, _):
        r = c.post("/v1/completions", json={"prompt": "a", "stop": "123456789"})
        assert r.status_code == 400 and "at most 8" in r.json()["error"]["message"]


def test_serving_limits_of_a_request_are_checked_when_the_app_is_built() -> None:
    m, tok = lm_and_tokenizer()
    with pytest.raises(ValueError, match="max_stop_chars=0"):
        create_app(m, tok, max_stop_chars=0)
    with pytest.raises(ValueError, match="max_body=0"):
        create_app(m, tok, max_body=0)


def test_a_prompt_is_tokenized_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a prompt's tokenization is held, the server still answers ``/health``: the
    tokenizer runs on a worker thread.  Tokenizing on the event loop, the health check would
    wait for the release, which comes only after it."""
    m, tok = lm_and_tokenizer()
    started, release = threading.Event(), threading.Event()
    encode = tok.encode

    def slow(text: str) -> list[int]:
        started.set()
        assert release.wait(60), "never released"
        return encode(text)

    monkeypatch.setattr(tok, "encode", slow)
    body = {"prompt": "the lazy", "max_tokens": 2}
    with served(create_app(m, tok, name="tiny")) as url, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=60)
        try:
            wait_until(started.is_set, "the prompt was never tokenized")
            health = httpx.get(f"{url}/health", timeout=20)
        finally:
            release.set()
        answer = pending.result()
    assert health.status_code == 200
    assert answer.status_code == 200, answer.text


class Held:
    """Holds ``target``'s first call until :meth:`release`, and counts the calls: a job held in
    its first decoding step (or batch) shows how far it went once its client left."""

    def __init__(self, owner: Any, name: str) -> None:
        self.calls, self.entered, self.released = 0, threading.Event(), threading.Event()
        real = getattr(owner, name)

        def held(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            if self.calls == 1:
                self.entered.set()
                assert self.released.wait(60), "never released"
            return real(*args, **kw)

        setattr(owner, name, held)

    def release(self) -> None:
        self.released.set()


def leave_after_sending(url: str, path: str, body: dict[str, Any], held: Held) -> None:
    """Send ``body`` over a raw socket, wait until the job is held in its first step, and
    close the connection without reading the answer."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head + payload)
        wait_until(held.entered.is_set, f"{path}'s job never started")


def test_a_translation_stops_within_one_step_when_its_client_leaves() -> None:
    """The client leaves while its beam search is held in step 1; the server notices, and the
    search stops before step 2: one decoder call of the ~30 a whole search makes."""
    m, tok, lines = mt_and_tokenizer()
    held = Held(m, "decode")
    app = create_app(m, tok, name="mt")
    with served(app) as url:
        leave_after_sending(url, "/v1/translate", {"text": lines, "beam": 4}, held)

        def cancelled() -> bool:
            return metrics(httpx.get(f"{url}/metrics").text)["requests_cancelled_total"] == 1

        wait_until(cancelled, "the server never noticed that its client left")
        held.release()
        jobs = app.state.served.translator.jobs
        wait_until(lambda: jobs.in_flight == 0, "the job never ended")
    assert held.calls == 1


@pytest.fixture
def encoder_app() -> Iterator[tuple[Any, EncoderLM]]:
    tok = CharTokenizer.from_text("abcdefgh ")
    m = tiny_model("bert-base", n_layers=1, vocab_size=tok.vocab_size, max_len=16)
    assert isinstance(m, EncoderLM)
    yield create_app(m, tok, name="enc", max_queue=1), m


def test_an_embedding_job_stops_before_its_next_batch_when_its_client_leaves(
    encoder_app: tuple[Any, EncoderLM],
) -> None:
    """40 inputs are two batches of 32 and 8; the client leaves during the first, and the
    second is never encoded."""
    app, m = encoder_app
    held = Held(m, "encode")
    embedder = app.state.served.embedder
    with served(app) as url:
        body = {"input": [[1, 2, 3]] * 40}
        leave_after_sending(url, "/v1/embeddings", body, held)
        wait_until(lambda: embedder.jobs.stats["cancelled"] == 1, "the leaving went unnoticed")
        held.release()
        wait_until(lambda: embedder.jobs.in_flight == 0, "the job never ended")
    assert held.calls == 1


def test_a_job_queue_admits_one_running_and_max_queue_waiting() -> None:
    """``max_queue=1``: one job runs, one waits, the third is refused.  A job whose client
    has left counts until its thread has stopped, so it is not replaced while it still runs."""
    jobs = JobQueue(max_queue=1, what="jobs")
    release = threading.Event()

    def job(token: CancelToken) -> int:
        assert release.wait(60)
        token.check()
        return 7

    async def scenario() -> tuple[list[Any], int]:
        first = asyncio.ensure_future(jobs.run(job, None))
        second = asyncio.ensure_future(jobs.run(job, None))
        await asyncio.sleep(0)
        while jobs.in_flight < 2:
            await asyncio.sleep(0.01)
        with pytest.raises(QueueFull, match="1 jobs are queued"):  # the timeout bounds a hang
            await asyncio.wait_for(jobs.run(job, None), timeout=30)
        first.cancel()  # its client left: the job goes on until it checks its token
        await asyncio.sleep(0.05)
        counted = jobs.in_flight
        release.set()
        return await asyncio.gather(first, second, return_exceptions=True), counted

    (first, second), counted = asyncio.run(scenario())
    assert counted == 2
    assert isinstance(first, asyncio.CancelledError) and second == 7
    assert jobs.in_flight == 0 and jobs.stats["rejected"] == 1


def test_an_unexpected_error_tells_the_client_nothing_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A route that fails inside answers a 500 without the exception's text (here a path),
    and so does a request the engine fails, streamed or not."""
    import aiayn.serve.engine as engine_module

    m, tok = lm_and_tokenizer()
    secret = "/srv/private/model.safetensors"

    def broken(*args: object, **kw: object) -> Any:
        raise RuntimeError(f"cannot read {secret}")

    app = create_app(m, tok, name="tiny")
    with TestClient(app, raise_server_exceptions=False) as c:
        with monkeypatch.context() as patch:
            patch.setattr(tok, "encode", broken)
            in_route = c.post("/v1/completions", json={"prompt": "a"})
        monkeypatch.setattr(engine_module, "choose_next", broken)
        in_engine = c.post("/v1/completions", json={"prompt": "a"})
        streamed = c.post("/v1/completions", json={"prompt": "a", "stream": True})
    for r in (in_route, in_engine):
        assert r.status_code == 500 and secret not in r.text
        assert r.json()["error"]["message"] == INTERNAL_ERROR
    assert INTERNAL_ERROR in streamed.text and secret not in streamed.text
