"""The server fuzzed by schemathesis against its own OpenAPI schema, in process: requests drawn
from every route's schema -- valid, and invalid in every way the schema allows to be broken --
never get a 5xx or an answer that breaks the schema (undocumented statuses, wrong shapes, a
405 without ``Allow``), with the API key and without it.

A 400 for a request the schema admits is not a failure here (schemathesis'
``positive_data_acceptance``): the schema says what a body looks like, and the server refuses
with a named 400 what a schema cannot say -- a prompt longer than the context, an unknown
role, a dimension an encoder cannot truncate to.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from aiayn.data.tokenizer import BPETokenizer
from aiayn.models import TransformerModel
from tests.conftest import tiny_model
from tests.serve.test_app import mt_and_tokenizer

KEY = "sk-fuzz-0123456789"
TEXT = "the quick brown fox jumps over the lazy dog. "


def lm() -> tuple[TransformerModel, BPETokenizer]:
    """A 1-layer model with a byte-level BPE tokenizer: any text a fuzzer draws is a prompt."""
    tok = BPETokenizer.from_lines([TEXT] * 4, vocab_size=300)
    small = {"n_layers": 1, "d_model": 16, "attention.n_heads": 2, "ffn.d_ff": 32, "max_len": 32}
    return tiny_model("gpt2-small", vocab_size=tok.vocab_size, **small), tok


# The served model, and whether a key is required and sent: with the key sent, every route is
# reached; without it, every request must get its documented 401.
SERVERS = {
    "lm-key-sent": ("lm", KEY),
    "lm-key-missing": ("lm", None),
    "mt": ("mt", None),
}


def app_of(name: str) -> FastAPI:
    """The server ``name`` of :data:`SERVERS`.  Its engine is started by the fixture, not by
    the app's lifespan, which schemathesis enters and leaves around every call."""
    from aiayn.serve.app import create_app

    kind, _ = SERVERS[name]
    model, tok = lm() if kind == "lm" else mt_and_tokenizer()[:2]
    key = KEY if name.startswith("lm-key") else None
    return create_app(model, tok, name="tiny", start_engine=False, api_key=key, max_batch=1)


@pytest.fixture(scope="module", params=list(SERVERS))
def server(request: pytest.FixtureRequest) -> Iterator[tuple[FastAPI, dict[str, str]]]:
    """A server of :data:`SERVERS`, and the headers its requests send."""
    app = app_of(request.param)
    engine = app.state.served.engine
    if engine is not None:
        engine.start()
    sent = SERVERS[request.param][1]
    try:
        yield app, {"Authorization": f"Bearer {sent}"} if sent else {}
    finally:
        if engine is not None:
            engine.stop()


def operations(app: FastAPI) -> list[Any]:
    """Every route of the app's own schema (read with the key: it is behind it when set)."""
    schema = schemathesis.openapi.from_asgi(
        "/openapi.json", app, headers={"Authorization": f"Bearer {KEY}"}
    )
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)
def test_no_request_gets_a_5xx_or_breaks_the_schema(
    server: tuple[FastAPI, dict[str, str]], mode: GenerationMode
) -> None:
    """Bodies drawn from each route's schema (``positive``) and bodies that break it
    (``negative``): every answer is documented, well-formed and below 500."""
    app, headers = server
    ops = operations(app)
    assert {op.path for op in ops} >= {"/v1/completions", "/v1/chat/completions", "/health"}
    for op in ops:
        if mode is GenerationMode.NEGATIVE and not len(op.body):
            continue  # nothing to break in a request without a body or parameters

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(deadline=None, suppress_health_check=list(HealthCheck))
        def fuzz(case: schemathesis.Case) -> None:
            case.call_and_validate(headers=headers, excluded_checks=[positive_data_acceptance])

        fuzz()


def test_a_wrong_method_names_the_allowed_ones() -> None:
    """A 405 carries ``Allow`` (RFC 9110), the error handler keeping the exception's headers."""
    from fastapi.testclient import TestClient

    with TestClient(app_of("lm-key-missing")) as client:
        r = client.request("TRACE", "/health")
    assert r.status_code == 405 and r.headers["allow"] == "GET"
