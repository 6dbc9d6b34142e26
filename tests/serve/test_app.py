"""The HTTP server: OpenAI-compatible completions (checked with the real `openai` client),
streaming, translation, limits and errors, metrics, and cancellation over a real socket."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
import torch
from fastapi.testclient import TestClient

import aiayn
from aiayn.data.tokenizer import BPETokenizer, CharTokenizer
from aiayn.generate import SamplingConfig, generate
from aiayn.generate.beam import BeamConfig
from aiayn.generate.translate import translate
from aiayn.models import DecoderLM, EncoderDecoder
from aiayn.serve.app import create_app
from aiayn.serve.engine import Engine, QueueFull
from aiayn.serve.engine import Request as EngineRequest
from tests.serve.support import served, sharpen, tiny_lm, wait_until

TEXT = "the quick brown fox jumps over the lazy dog. "
GREEDY = SamplingConfig(temperature=0)


def lm_and_tokenizer(max_len: int = 96) -> tuple[DecoderLM, CharTokenizer]:
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    m = aiayn.build_model(
        "gpt2-small",
        n_layers=2,
        d_model=32,
        attention={"n_heads": 4},
        ffn={"d_ff": 64},
        vocab_size=tok.vocab_size,
        max_len=max_len,
        dropout=0.0,
    )
    assert isinstance(m, DecoderLM)
    return m.eval(), tok


def offline(m: DecoderLM, tok: CharTokenizer, prompt: str, n: int) -> str:
    return tok.decode(generate(m, [tok.encode(prompt)], max_new_tokens=n, sampling=GREEDY)[0])


@contextmanager
def client(**kw: object) -> Iterator[tuple[TestClient, DecoderLM, CharTokenizer]]:
    m, tok = lm_and_tokenizer()
    with TestClient(create_app(m, tok, name="tiny", **kw)) as c:  # type: ignore[arg-type]
        yield c, m, tok


def metrics(text: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(r"^aiayn_(\w+) (\S+)$", text, re.M)}


class Pause:
    """Holds ``engine`` before each decoding step while a request is running, until
    :meth:`release`: while held, no request makes a token, so a test knows exactly how many
    each has made.  ``requests`` are the engine requests submitted, in order."""

    def __init__(self, engine: Engine) -> None:
        self.requests: list[EngineRequest] = []
        self.held, self.released = threading.Event(), threading.Event()
        submit, step = engine.submit, engine._decode_step

        def recorded(request: EngineRequest) -> None:
            self.requests.append(request)
            submit(request)

        def held_step() -> None:
            if engine.running and not self.released.is_set():
                self.held.set()
                while not self.released.wait(0.01) and not engine.stopping:
                    pass  # a stopping engine is never held (the server shuts down)
            step()

        engine.submit = recorded  # type: ignore[method-assign]
        engine._decode_step = held_step  # type: ignore[method-assign]

    def release(self) -> None:
        self.released.set()


def mt_and_tokenizer() -> tuple[EncoderDecoder, BPETokenizer, list[str]]:
    """A 1-layer untrained translation model, its BPE tokenizer and four source lines."""
    lines = ["ein hund läuft", "zwei katzen schlafen", "ein mann liest", "der hund schläft"]
    tok = BPETokenizer.from_lines(lines * 4, vocab_size=300)
    torch.manual_seed(0)
    m = aiayn.build_model(
        "paper-base",
        n_layers=1,
        d_model=32,
        attention={"n_heads": 4},
        ffn={"d_ff": 64},
        vocab_size=tok.vocab_size,
        max_len=32,
        dropout=0.0,
    )
    assert isinstance(m, EncoderDecoder)
    return m.eval(), tok, lines


def test_completion_equals_offline_generate_and_streams_the_same_text() -> None:
    with client() as (c, m, tok):
        body = {"model": "tiny", "prompt": "the lazy", "max_tokens": 20, "temperature": 0}
        r = c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["object"] == "text_completion" and got["model"] == "tiny"
        assert got["choices"][0]["text"] == offline(m, tok, "the lazy", 20)
        assert got["choices"][0]["finish_reason"] == "length"
        assert got["usage"] == {"prompt_tokens": 8, "completion_tokens": 20, "total_tokens": 28}
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in s.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == got["choices"][0]["text"]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert all(ch["choices"][0]["finish_reason"] is None for ch in chunks[:-1])


def test_stop_and_seed() -> None:
    with client() as (c, m, tok):
        full = offline(m, tok, "a", 30)
        stop = full[5:8]
        r = c.post(
            "/v1/completions",
            json={"prompt": "a", "max_tokens": 30, "temperature": 0, "stop": stop},
        ).json()
        assert r["choices"][0] == {
            "text": full[: full.find(stop)],
            "index": 0,
            "logprobs": None,
            "finish_reason": "stop",
        }
        body = {"prompt": "a", "max_tokens": 15, "temperature": 0.9, "top_k": 4, "seed": 3}
        first, second = (c.post("/v1/completions", json=body).json() for _ in range(2))
        want = generate(
            m,
            [tok.encode("a")],
            max_new_tokens=15,
            seed=3,
            sampling=SamplingConfig(temperature=0.9, top_k=4),
        )[0]
        assert first["choices"][0]["text"] == second["choices"][0]["text"] == tok.decode(want)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": "a" * 96, "max_tokens": 1}, 400, "96 tokens; this server takes at most 95"),
        ({"prompt": "a" * 90, "max_tokens": 10}, 400, "exceed the context of 96"),
        ({"prompt": "a", "max_tokens": 97}, 400, "max_tokens=97: at most 96"),
        ({"prompt": "", "max_tokens": 1}, 400, "prompt: empty"),
        ({"prompt": "a", "n": 17}, 400, "17 choices; this server makes at most 16"),
        ({"prompt": ["a"] * 6, "best_of": 3}, 400, "18 choices"),
        ({"prompt": "a", "n": 3, "best_of": 2}, 400, "best_of=2: at least n=3"),
        ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens=0: only with echo"),
        ({"prompt": "a", "logit_bias": {"x": 1}}, 400, "logit_bias: 'x' is not a token id"),
        ({"prompt": "a", "logit_bias": {"28": 1}}, 400, "(0 to 27)"),
        ({"prompt": "a", "suffix": "b"}, 400, "suffix: insertion is not supported"),
        ({"prompt": "a", "temperature": -1}, 400, "temperature"),
        ({"prompt": "a", "top_p": 0}, 400, "top_p"),
        ({"prompt": "a", "stop": [""]}, 400, "stop"),
        ({"max_tokens": 1}, 400, "prompt"),
        ({"prompt": "a", "seed": 2**64}, 400, "seed"),
        ({"prompt": "a", "top_k": 1000}, 400, "top_k=1000: the vocabulary has"),
        ({"prompt": "Zebra"}, 400, "prompt: character 'Z' is not in the tokenizer's vocabulary"),
        ({"prompt": [3, 999]}, 400, "prompt: token id 999 is outside the vocabulary (0 to 27)"),
        ({"prompt": [[1], [2, 999]]}, 400, "token id 999 is outside the vocabulary"),
        ({"prompt": "a", "logprobs": 21}, 400, "logprobs"),
        ({"prompt": "a", "best_of": 3, "stream": True}, 400, "cannot be streamed"),
    ],
)
def test_bad_requests_get_a_clear_400(body: dict, status: int, message: str) -> None:
    with client() as (c, _, _):
        r = c.post("/v1/completions", json=body)
        assert r.status_code == status
        assert message in r.json()["error"]["message"]


def test_limits_busy_and_stopped() -> None:
    with client(max_prompt_tokens=10, max_new_tokens=5) as (c, _, _):
        r = c.post("/v1/completions", json={"prompt": "a" * 11})
        assert r.status_code == 400 and "at most 10" in r.json()["error"]["message"]
        r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 6})
        assert r.status_code == 400 and "at most 5" in r.json()["error"]["message"]
        engine = c.app.state.engine  # type: ignore[attr-defined]
        submit = engine.submit
        engine.submit = lambda request: (_ for _ in ()).throw(QueueFull("3 are waiting"))
        r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert r.status_code == 429 and "busy" in r.json()["error"]["message"]
        engine.submit = submit
        engine.stop()
        r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
        assert r.status_code == 503 and "not running" in r.json()["error"]["message"]
        health = c.get("/health")  # a probe reads the status code
        assert health.status_code == 503 and health.json()["status"] == "stopped"


def test_token_id_prompts_a_tiny_temperature_and_the_time_of_each_response(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with client() as (c, _, tok):
        text = c.post(
            "/v1/completions", json={"prompt": "the", "max_tokens": 8, "temperature": 0}
        ).json()
        for prompt in (tok.encode("the"), [tok.encode("the")]):  # OpenAI's token-id forms
            ids = c.post(
                "/v1/completions", json={"prompt": prompt, "max_tokens": 8, "temperature": 0}
            ).json()
            assert ids["choices"][0]["text"] == text["choices"][0]["text"]
        # softmax(l / T) overflowed for a tiny T (a 500); its limit is the greedy choice.
        r = c.post("/v1/completions", json={"prompt": "the", "max_tokens": 8, "temperature": 1e-45})
        assert r.status_code == 200 and r.json()["choices"] == text["choices"]
        # `created` is when the response was made, not when the app was.
        later = time.time() + 1000
        monkeypatch.setattr(time, "time", lambda: later)
        r = c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}).json()
        assert r["created"] == int(later)


def test_serving_limits_are_checked_when_the_app_is_built() -> None:
    m, tok = lm_and_tokenizer()
    for kw, message in [
        ({"max_new_tokens": 0}, "max_new_tokens=0: expected at least 1"),
        ({"max_prompt_tokens": -1}, "max_prompt_tokens=-1"),
        ({"max_queue": -1}, "max_queue=-1: expected at least 0"),
        ({"max_batch": 0}, "max_batch=0"),
        ({"prefill_chunk": 0}, "prefill_chunk=0"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            create_app(m, tok, **kw)  # type: ignore[arg-type]


def test_metrics_print_large_counters_exactly() -> None:
    with client() as (c, _, _):
        c.app.state.engine.stats["tokens"] = 1_234_567  # type: ignore[attr-defined]
        assert "aiayn_tokens_generated_total 1234567\n" in c.get("/metrics").text


def test_health_and_metrics_count_what_happened() -> None:
    with client(max_batch=4) as (c, _, _):
        assert c.get("/health").json() == {
            "status": "ok",
            "model": "tiny",
            "kind": "DecoderLM",
            "max_len": 96,
        }
        for n in (3, 4):
            c.post("/v1/completions", json={"prompt": "a", "max_tokens": n, "temperature": 0})
        r = c.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain")
        got = metrics(r.text)
        assert got["requests_total"] == 2 and got["tokens_generated_total"] == 7
        assert got["requests_finished_length_total"] == 2
        assert got["cache_slots_total"] == 4 and got["cache_slots_in_use"] == 0
        assert got["queue_depth"] == 0 and got["running_batch_size"] == 0
        assert got["tokens_per_second"] > 0
        assert "# TYPE aiayn_requests_total counter" in r.text


def test_the_openai_client_with_eight_concurrent_requests_and_streams() -> None:
    m, tok = lm_and_tokenizer()
    app = create_app(m, tok, name="tiny", max_batch=4)
    prompts = [TEXT[i : i + 1 + 3 * i] for i in range(8)]
    with served(app) as url:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

        def complete(i: int) -> str:
            r = api.completions.create(
                model="tiny", prompt=prompts[i], max_tokens=5 + 3 * i, temperature=0
            )
            return r.choices[0].text

        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(complete, range(8)))
        for i, text in enumerate(texts):
            assert text == offline(m, tok, prompts[i], 5 + 3 * i), i

        stream = api.completions.create(
            model="tiny", prompt="the", max_tokens=12, temperature=0, stream=True
        )
        streamed = "".join(chunk.choices[0].text for chunk in stream)
        assert streamed == offline(m, tok, "the", 12)
        stream = api.completions.create(
            model="tiny",
            prompt="the",
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(ch.choices[0].text for ch in chunks[:-1]) == offline(m, tok, "the", 12)
        last = chunks[-1]  # OpenAI's closing chunk: no choices, the usage
        assert last.choices == [] and last.usage is not None
        assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (3, 12)

        with pytest.raises(openai.BadRequestError, match="at most"):
            api.completions.create(model="tiny", prompt="a", max_tokens=500)


def assert_freed_after_one_token(pause: Pause, leaving: EngineRequest, url: str) -> None:
    """The server notices that ``leaving``'s client has gone while the engine is held; once
    released, the engine frees its row before the next step: 1 token made, none after."""
    wait_until(lambda: leaving.cancelled, "the server did not notice the client leave")
    pause.release()
    wait_until(lambda: leaving.finish_reason is not None, "the request never finished")
    got = metrics(httpx.get(f"{url}/metrics").text)
    assert leaving.finish_reason == "cancelled", leaving.finish_reason
    assert len(leaving.tokens) == 1, f"{len(leaving.tokens)} tokens made for a client gone"
    assert got["tokens_generated_total"] == 1 and got["requests_finished_cancelled_total"] == 1
    assert got["cache_slots_in_use"] == 0 and got["running_batch_size"] == 0


def test_a_client_that_leaves_mid_stream_stops_its_generation_at_once() -> None:
    """The claim, in tokens: a streaming client that disconnects after its first token gets
    no further token made for it.  The engine is held after that token (:class:`Pause`), so
    the count does not depend on the host's speed: the server notices the closed connection
    with no token in flight, and the engine, released, frees the row before its next step --
    1 token made of the 90 asked for, the row free, the count "cancelled"."""
    m, tok = lm_and_tokenizer()
    app = create_app(m, tok, name="tiny", max_batch=2)
    pause = Pause(app.state.engine)
    with served(app) as url:
        body = {"prompt": "a", "max_tokens": 90, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as s:
            first = next(line for line in s.iter_lines() if line.startswith("data: {"))
        # The client has gone (its connection closed), having read one token.
        wait_until(pause.held.is_set, "the engine never reached its next decoding step")
        (leaving,) = pause.requests
        assert len(leaving.tokens) == 1 and json.loads(first[6:])["choices"][0]["text"] == (
            tok.decode(leaving.tokens)
        )
        assert_freed_after_one_token(pause, leaving, url)


@pytest.mark.parametrize(
    ("kind", "batching"),
    [("rope", True), ("alibi", True), ("gqa-llama", True), ("rope", False)],
    ids=["rope", "alibi", "gqa-llama", "rope-no-batching"],
)
def test_each_model_kind_served_over_http_equals_offline_generate(
    kind: str, batching: bool
) -> None:
    """RoPE, ALiBi and grouped-query (Llama-style) models, batched and one request at a time
    (``--no-batching``), over a real socket: five concurrent requests -- greedy, seeded
    sampling, streamed -- each get the tokens offline generate() gives.  The requests are all
    queued, in order, before the engine starts, so they share the same decoding steps whatever
    the host's speed."""
    tok = CharTokenizer.from_text(TEXT)
    m = sharpen(tiny_lm(kind, tok.vocab_size, max_len=96))  # position-sensitive (kinds.py)
    app = create_app(m, tok, name="tiny", max_batch=3, batching=batching, start_engine=False)
    engine: Engine = app.state.engine
    rows: list[int] = []
    step = engine._decode_step

    def counted() -> None:  # the rows of each decoding step
        if engine.running:
            rows.append(len(engine.running))
        step()

    engine._decode_step = counted  # type: ignore[method-assign]
    sampled = SamplingConfig(temperature=0.9, top_k=4)
    cases = [  # (prompt, max_tokens, sampling, seed, stream)
        (TEXT[:1], 12, GREEDY, None, False),
        (TEXT[4:19], 9, GREEDY, None, False),
        (TEXT[10:16], 15, sampled, 5, False),
        (TEXT[20:40], 7, GREEDY, None, True),
        (TEXT[2:5], 11, GREEDY, None, False),
    ]

    def complete(url: str, case: tuple[str, int, SamplingConfig, int | None, bool]) -> str:
        prompt, n, sampling, seed, stream = case
        body = {
            "prompt": prompt,
            "max_tokens": n,
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "seed": seed,
            "stream": stream,
        }
        if not stream:
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return str(r.json()["choices"][0]["text"])
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as s:
            lines = [line[6:] for line in s.iter_lines() if line.startswith("data: {")]
        return "".join(json.loads(line)["choices"][0]["text"] for line in lines)

    try:
        with served(app) as url, ThreadPoolExecutor(len(cases)) as pool:
            futures = []
            for i, case in enumerate(cases):  # queued in this order: rows 0, 1, 2 as listed
                futures.append(pool.submit(complete, url, case))
                wait_until(lambda: engine.stats["requests"] == i + 1, f"request {i} not queued")  # noqa: B023
            engine.start()
            texts = [f.result() for f in futures]
    finally:
        engine.stop()
    for i, ((prompt, n, sampling, seed, _), text) in enumerate(zip(cases, texts, strict=True)):
        want = generate(m, [tok.encode(prompt)], max_new_tokens=n, sampling=sampling, seed=seed)
        assert text == tok.decode(want[0]), f"request {i} ({kind})"
    # Each step decodes (n, 1) ids: several rows at once when batching, one row without.
    assert (1 < max(rows) <= 3) if batching else set(rows) == {1}, rows


def test_a_client_that_leaves_a_non_streaming_request_frees_its_row() -> None:
    """A non-streaming client that gives up is noticed while its request runs (the server
    looks every quarter second, tokens or not), not when max_tokens is reached.  Counted in
    tokens: the engine is held after the request's first token (:class:`Pause`), the client
    closes its connection, and the released engine frees the row before its next step -- 1
    token made of the 4,000 asked for."""
    m, tok = lm_and_tokenizer(max_len=4096)
    app = create_app(m, tok, name="tiny", max_batch=2)
    pause = Pause(app.state.engine)
    with served(app) as url:
        host, port = url.removeprefix("http://").split(":")
        payload = json.dumps({"prompt": "a", "max_tokens": 4000, "temperature": 0}).encode()
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(head + payload)
            wait_until(pause.held.is_set, "the engine never reached its next decoding step")
        # The client has gone, with no answer; its request made one token (the prefill's).
        (leaving,) = pause.requests
        assert len(leaving.tokens) == 1
        assert_freed_after_one_token(pause, leaving, url)


def test_translation_endpoint_equals_translate() -> None:
    m, tok, lines = mt_and_tokenizer()
    with TestClient(create_app(m, tok, name="mt")) as c:
        r = c.post("/v1/translate", json={"text": lines[:2], "beam": 3})
        assert r.status_code == 200, r.text
        assert r.json()["translations"] == translate(m, tok, lines[:2], beam=BeamConfig(3))
        r = c.post("/v1/translate", json={"text": lines[2], "beam": 1})
        assert r.json()["translations"] == translate(m, tok, [lines[2]], beam=None)[0]
        r = c.post("/v1/completions", json={"prompt": "a"})
        assert r.status_code == 400 and "/v1/translate" in r.json()["error"]["message"]
        r = c.post("/v1/translate", json={"text": "ein " * 40})
        assert r.status_code == 400 and "at most 32" in r.json()["error"]["message"]
        got = metrics(c.get("/metrics").text)  # a translation server reports its own counts
        assert got["requests_total"] == 3 and got["lines_translated_total"] == 3
        assert got["requests_failed_total"] == 1 and got["queue_depth"] == 0
        assert got["requests_rejected_total"] == 0


# `python -m aiayn` with Ctrl-C's ordinary handler: a process started where SIGINT is ignored
# (a shell's background job, some CI runners) passes that on, and Python then installs no
# KeyboardInterrupt handler; a terminal's Ctrl-C always finds one.
AIAYN_WITH_CTRL_C = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " from aiayn.cli import main; sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "stop", "flags"),
    [("lm", "SIGTERM", []), ("lm", "SIGINT", ["--no-batching"]), ("mt", "SIGTERM", [])],
    ids=["lm-SIGTERM", "lm-SIGINT-no-batching", "translation-SIGTERM"],
)
def test_the_serve_command_serves_a_checkpoint_and_stops_on_a_signal(  # noqa: PLR0915 (one process's life, in order)
    tmp_path: Path, kind: str, stop: str, flags: list[str]
) -> None:
    """`aiayn serve` in a process of its own: health, metrics, an exact completion (a language
    model, batched or ``--no-batching``) or exact translations (an encoder-decoder:
    ``/v1/translate`` equals translate() on the same checkpoint, loaded from its folder), and
    a clean exit on SIGTERM or Ctrl-C (SIGINT).  The process is killed if the test fails."""
    import signal
    import socket
    import subprocess
    import sys

    from aiayn.checkpoint import load, save
    from aiayn.checkpoint.bundle import TOKENIZER_FILE

    folder = tmp_path / "run" / "checkpoint"
    if kind == "lm":
        m, tok = lm_and_tokenizer()
        save(m, folder)
    else:
        mt, bpe, lines = mt_and_tokenizer()
        save(mt, folder)
        tok = bpe  # type: ignore[assignment]
    tok.save(folder / TOKENIZER_FILE)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch = ["-c", AIAYN_WITH_CTRL_C] if stop == "SIGINT" else ["-m", "aiayn"]
    cmd = [
        sys.executable,
        *launch,
        "serve",
        "--checkpoint",
        str(folder),
        "--port",
        str(port),
        "--max-batch",
        "2",
        "--log-level",
        "warning",
        *flags,
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"{url}/health", timeout=1).json()
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()  # type: ignore[union-attr]
                time.sleep(0.1)
        assert health["model"] == "run" and health["status"] == "ok"
        if kind == "lm":
            body = {"prompt": "the", "max_tokens": 6, "temperature": 0}
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
            assert r.json()["choices"][0]["text"] == offline(m, tok, "the", 6)
            slots = 1 if "--no-batching" in flags else 2
            assert metrics(httpx.get(f"{url}/metrics").text)["cache_slots_total"] == slots
        else:
            assert health["kind"] == "EncoderDecoder"
            bundle = load(folder)
            assert isinstance(bundle.model, EncoderDecoder)
            assert isinstance(bundle.tokenizer, BPETokenizer)
            r = httpx.post(f"{url}/v1/translate", json={"text": lines[:3], "beam": 3}, timeout=60)
            want = translate(bundle.model.eval(), bundle.tokenizer, lines[:3], beam=BeamConfig(3))
            assert r.status_code == 200 and r.json() == {"model": "run", "translations": want}
            got = metrics(httpx.get(f"{url}/metrics").text)
            assert got["requests_total"] == 1 and got["lines_translated_total"] == 3
        proc.send_signal(getattr(signal, stop))
        assert proc.wait(30) == 0
        log = proc.stderr.read()  # type: ignore[union-attr]
        # An ordinary stop is not an error: no traceback (a forced exit cancelled the app's
        # lifespan and uvicorn logged one).
        assert "aiayn serve: stopped" in log and "Traceback" not in log, log
    finally:
        if proc.poll() is None:  # the test failed: leave no server behind
            proc.kill()
            proc.wait(30)
        proc.stderr.close()  # type: ignore[union-attr]


def test_a_full_translation_queue_is_a_429(monkeypatch: pytest.MonkeyPatch) -> None:
    """``max_queue=1``: one translation runs, one waits, the next is refused with a 429 --
    decided by the queue, not by timing: translate() is held until both are in (the metrics'
    queue depth says 2).  The two then finish with what translate() gives."""
    import aiayn.serve.translator as translator_module

    m, tok, lines = mt_and_tokenizer()
    release = threading.Event()

    def held(*args: object, **kw: object) -> list[str]:
        assert release.wait(60), "never released"
        return translate(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(translator_module, "translate", held)
    app = create_app(m, tok, name="mt", max_queue=1)
    bodies: list[dict[str, object]] = [
        {"text": lines[:2], "beam": 2},
        {"text": lines[3], "beam": 1},
    ]
    with served(app) as url, ThreadPoolExecutor(3) as pool:

        def post(body: dict[str, object]) -> httpx.Response:
            return httpx.post(f"{url}/v1/translate", json=body, timeout=60)

        def depth() -> float:
            return metrics(httpx.get(f"{url}/metrics").text)["queue_depth"]

        try:
            first = pool.submit(post, bodies[0])
            second = pool.submit(post, bodies[1])
            wait_until(lambda: depth() == 2, "the two translations did not both arrive")
            third = pool.submit(post, {"text": "ein hund"})
            # Answered at once, or queued as a third (a limit not kept): whichever comes first.
            wait_until(lambda: third.done() or depth() == 3, "the third got no answer")
            assert third.done(), "a third translation was queued beyond max_queue=1"
            refused = third.result()
            release.set()
            answers = [first.result().json(), second.result().json()]
            got = metrics(httpx.get(f"{url}/metrics").text)
        finally:  # the held translations end, pass or fail
            release.set()
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and "translations are queued" in error["message"]
    assert answers[0]["translations"] == translate(m, tok, lines[:2], beam=BeamConfig(2))
    assert answers[1]["translations"] == translate(m, tok, [lines[3]], beam=None)[0]
    assert got["requests_rejected_total"] == 1 and got["requests_total"] == 2
    assert got["lines_translated_total"] == 3 and got["queue_depth"] == 0


def test_a_bpe_checkpoint_stops_at_its_end_of_text_token() -> None:
    """The tokenizer's `</s>` is the EOS: generation stops there (finish_reason "stop") and
    the EOS is not part of the text."""
    from aiayn.serve.served import eos_id

    tok = BPETokenizer.from_lines([TEXT] * 8, vocab_size=300)
    eos = eos_id(tok)
    assert eos == tok.tok.token_to_id("</s>")
    torch.manual_seed(0)
    m = aiayn.build_model(
        "gpt2-small",
        n_layers=1,
        d_model=32,
        attention={"n_heads": 4},
        ffn={"d_ff": 64},
        vocab_size=tok.vocab_size,
        max_len=64,
        dropout=0.0,
    )
    assert isinstance(m, DecoderLM)
    m.eval()
    prompt = tok.encode("the quick")
    plain = generate(m, [prompt], max_new_tokens=6, sampling=GREEDY)[0]
    second = plain[1]
    assert eos not in prompt + plain and second not in prompt + plain[:1]
    body = {"prompt": "the quick", "max_tokens": 6, "temperature": 0}
    with TestClient(create_app(m, tok, name="bpe")) as c:
        r = c.post("/v1/completions", json=body).json()
        assert r["choices"][0]["finish_reason"] == "length"
        assert r["choices"][0]["text"] == tok.decode(plain)
    # Relabel: the token generated second and </s> swap ids (their rows of the tied table),
    # so the same model now emits </s> second.
    with torch.no_grad():
        rows = m.embed.token.weight
        rows[[second, eos]] = rows[[eos, second]]
    with TestClient(create_app(m, tok, name="bpe")) as c:
        r = c.post("/v1/completions", json=body).json()
        assert r["choices"][0]["finish_reason"] == "stop"
        assert r["choices"][0]["text"] == tok.decode(plain[:1])
        assert r["usage"]["completion_tokens"] == 2


def test_serve_exits_with_an_error_when_its_port_is_taken(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket
    import subprocess
    import sys

    from aiayn.checkpoint import save
    from aiayn.checkpoint.bundle import TOKENIZER_FILE

    m, tok = lm_and_tokenizer()
    save(m, tmp_path / "ckpt")
    tok.save(tmp_path / "ckpt" / TOKENIZER_FILE)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [
            sys.executable,
            "-m",
            "aiayn",
            "serve",
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--port",
            str(port),
            "--log-level",
            "critical",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"could not serve on 127.0.0.1:{port}" in done.stderr
