"""The OpenAI fields that scoring and sampling clients need -- ``logprobs``, ``echo``, ``n``,
``best_of``, ``seed``, penalties, ``logit_bias``, prompt batches -- checked against the model
itself: every log-probability the server returns equals ``log_softmax`` of the offline
model's logits at that prefix (one full forward pass, no cache), and every sampled choice
equals offline ``generate`` with the choice's seed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
import torch
from fastapi.testclient import TestClient

from aiayn.data.tokenizer import CharTokenizer
from aiayn.generate import SamplingConfig, generate
from aiayn.models import DecoderLM
from aiayn.serve.app import create_app
from tests.serve.support import served, sharpen
from tests.serve.test_app import lm_and_tokenizer

GREEDY = SamplingConfig(temperature=0)


def tolerance(dtype: torch.dtype, logits: torch.Tensor) -> float:
    """How far the server's log-probabilities may be from the offline ones.  The server reads
    the prompt through the KV cache in chunks and the offline pass reads it whole: the same
    sums in another order, each logit off by a few units of the dtype's rounding (eps) times
    its size, and a log-softmax off by at most twice the largest logit error.  Eight eps of
    the largest logit covers two layers of that, for fp32 (1.2e-7) and bf16 (7.8e-3) alike."""
    eps = torch.finfo(dtype).eps
    return 8 * eps * float(logits.abs().max()) + 1e-6


def dtype_of(m: DecoderLM) -> torch.dtype:
    return next(m.parameters()).dtype


@torch.no_grad()
def offline_logprobs(m: DecoderLM, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(T-1,) log-probability of each token after the first, given the ones before it, and
    the (T, V) logits, from one forward pass over ``ids``."""
    logits = m(torch.tensor([ids]))[0].float()  # (T, V)
    lp = logits.log_softmax(-1)
    return lp[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0], logits


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def tiny(request: pytest.FixtureRequest) -> Iterator[tuple[TestClient, DecoderLM, CharTokenizer]]:
    """A sharpened tiny LM (its distributions far from uniform, so that a wrong position or a
    wrong temperature moves the log-probabilities) in the dtype, served."""
    m, tok = lm_and_tokenizer()
    m = sharpen(m).to(request.param)
    with TestClient(create_app(m, tok, name="tiny", prefill_chunk=4)) as c:
        yield c, m, tok


def test_echo_and_logprobs_equal_the_offline_log_softmax(tiny: Any) -> None:
    """Prompt and reply, in one list (``echo``), each token's log-probability and its top 3;
    sampled at temperature 0.7 with top-k 5, the values are still the model's own (before the
    temperature and the filter, as vLLM reports them)."""
    c, m, tok = tiny
    body = {"prompt": "the lazy dog", "max_tokens": 6, "logprobs": 3, "echo": True}
    r = c.post("/v1/completions", json={**body, "temperature": 0.7, "top_k": 5, "seed": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    prompt = tok.encode("the lazy dog")
    made = [tok.encode(t)[0] for t in lp["tokens"][len(prompt) :]]
    assert choice["text"] == "the lazy dog" + tok.decode(made)
    want, logits = offline_logprobs(m, [*prompt, *made])
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    got = torch.tensor(lp["token_logprobs"][1:])
    torch.testing.assert_close(got, want, atol=tolerance(dtype_of(m), logits), rtol=0)
    assert lp["tokens"] == [tok.decode([i]) for i in [*prompt, *made]]
    assert lp["text_offset"] == list(range(len(prompt) + len(made)))  # one character a token
    full, atol = logits.log_softmax(-1), tolerance(dtype_of(m), logits)
    for position, top in enumerate(lp["top_logprobs"][1:]):  # the top 3 at every position
        best = full[position].topk(3)
        assert set(top) == {tok.decode([i]) for i in best.indices.tolist()}
        got = torch.tensor(sorted(top.values(), reverse=True))
        torch.testing.assert_close(got, best.values, atol=atol, rtol=0)


def test_echo_with_max_tokens_0_scores_the_prompt_alone(tiny: Any) -> None:
    """What lm-evaluation-harness sends for every log-likelihood: token ids, echo, no new
    tokens -- in a batch of two prompts."""
    c, m, tok = tiny
    prompts = [tok.encode("the quick brown"), tok.encode("a dog")]
    body = {"prompt": prompts, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [ch["index"] for ch in choices] == [0, 1]
    for ids, choice in zip(prompts, choices, strict=True):
        assert choice["text"] == tok.decode(ids) and choice["finish_reason"] == "length"
        want, logits = offline_logprobs(m, ids)
        got = torch.tensor(choice["logprobs"]["token_logprobs"][1:])
        torch.testing.assert_close(got, want, atol=tolerance(dtype_of(m), logits), rtol=0)
    assert r.json()["usage"]["completion_tokens"] == 0


def test_n_choices_are_the_seeded_draws_and_a_batch_is_indexed_prompt_major() -> None:
    """``n=3`` with ``seed=5``: choice j is offline generate with seed 5 + j, so the three are
    independent draws (and differ); two prompts give 6 choices, prompt 0's first."""
    m, tok = lm_and_tokenizer()
    sampling = SamplingConfig(temperature=1.0)
    prompts = ["a", "the"]
    body = {"prompt": prompts, "max_tokens": 8, "n": 3, "seed": 5, "temperature": 1.0}
    with TestClient(create_app(m, tok, name="tiny")) as c:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [ch["index"] for ch in choices] == list(range(6))
    for p, prompt in enumerate(prompts):
        for j in range(3):
            seed = 5 + p * 3 + j
            want = generate(m, [tok.encode(prompt)], max_new_tokens=8, sampling=sampling, seed=seed)
            assert choices[p * 3 + j]["text"] == tok.decode(want[0]), (p, j)
    assert len({ch["text"] for ch in choices[:3]}) == 3


def test_best_of_keeps_the_draw_of_highest_log_probability() -> None:
    m, tok = lm_and_tokenizer()
    sampling = SamplingConfig(temperature=1.0)
    ids = tok.encode("the")
    body = {"prompt": "the", "max_tokens": 6, "best_of": 4, "n": 1, "seed": 11, "logprobs": 0}
    with TestClient(create_app(m, tok, name="tiny")) as c:
        got = c.post("/v1/completions", json=body).json()
    scores = {}
    for seed in range(11, 15):
        made = generate(m, [ids], max_new_tokens=6, sampling=sampling, seed=seed)[0]
        lp, _ = offline_logprobs(m, [*ids, *made])
        scores[tok.decode(made)] = float(lp[len(ids) - 1 :].sum())
    assert got["choices"][0]["text"] == max(scores, key=scores.__getitem__)
    assert got["usage"]["completion_tokens"] == 24  # all four draws were made


@torch.no_grad()
def penalised_greedy(
    m: DecoderLM, ids: list[int], n: int, presence: float, frequency: float, bias: dict[int, float]
) -> list[int]:
    """OpenAI's formula, written out: logits - presence * (count > 0) - frequency * count +
    bias, over the tokens generated so far, then the argmax (one full pass a token)."""
    made: list[int] = []
    for _ in range(n):
        logits = m(torch.tensor([[*ids, *made]]))[0, -1].float()
        for token in set(made):
            logits[token] -= presence + frequency * made.count(token)
        for token, value in bias.items():
            logits[token] += value
        made.append(int(logits.argmax()))
    return made


def test_penalties_and_logit_bias_shape_what_is_sampled() -> None:
    m, tok = lm_and_tokenizer()
    ids = tok.encode("the ")
    space = tok.encode(" ")[0]
    with TestClient(create_app(m, tok, name="tiny")) as c:
        for presence, frequency, bias in ((1.5, 0.0, {}), (0.0, 2.0, {}), (0.5, 0.5, {space: 3.0})):
            body = {
                "prompt": "the ",
                "max_tokens": 12,
                "temperature": 0,
                "presence_penalty": presence,
                "frequency_penalty": frequency,
                "logit_bias": {str(k): v for k, v in bias.items()},
            }
            got = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
            want = penalised_greedy(m, ids, 12, presence, frequency, bias)
            assert got == tok.decode(want), (presence, frequency, bias)
        plain = c.post(
            "/v1/completions", json={"prompt": "the ", "max_tokens": 12, "temperature": 0}
        ).json()
    assert plain["choices"][0]["text"] != tok.decode(penalised_greedy(m, ids, 12, 0, 2.0, {}))


def test_tokenize_detokenize_and_tokenizer_info() -> None:
    m, tok = lm_and_tokenizer()
    with TestClient(create_app(m, tok, name="tiny")) as c:
        ids = c.post("/tokenize", json={"prompt": "the dog"}).json()
        text = c.post("/detokenize", json={"tokens": ids["tokens"]}).json()
        info = c.get("/tokenizer_info").json()
        bad = c.post("/detokenize", json={"tokens": [999]})
    assert ids["tokens"] == tok.encode("the dog") and ids["count"] == 7
    assert text == {"prompt": "the dog"}
    assert info["model_max_length"] == 96 and "eos_token" in info
    assert bad.status_code == 400 and "999" in bad.json()["error"]["message"]


def test_the_openai_client_reads_logprobs_echo_n_and_seed() -> None:
    m, tok = lm_and_tokenizer()
    with served(create_app(m, tok, name="tiny")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        scored = client.completions.create(
            model="tiny", prompt="the lazy", max_tokens=4, logprobs=5, echo=True, temperature=0
        )
        drawn = client.completions.create(model="tiny", prompt="a", max_tokens=6, n=3, seed=7)
        again = client.completions.create(model="tiny", prompt="a", max_tokens=6, n=3, seed=7)
    lp = scored.choices[0].logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == 8 + 4
    assert all(len(top) == 5 for top in lp.top_logprobs[1:] if top is not None)
    assert [c.text for c in drawn.choices] == [c.text for c in again.choices]
    assert len(drawn.choices) == 3


@pytest.mark.slow
def test_96_concurrent_mixed_requests_each_equal_offline() -> None:
    """96 requests at once, 16 decoding together: plain greedy ones, ones with logprobs and
    echo, batches of two prompts, n=2 seeded draws.  Every reply equals its offline
    counterpart, whatever else shared its steps (fp32; the log-probabilities to the derived
    tolerance)."""
    m, tok = lm_and_tokenizer()
    sampling = SamplingConfig(temperature=1.0)
    words = ["the", "a lazy", "quick brown", "dog", "fox jumps", "over the"]

    def body(i: int) -> dict[str, Any]:
        prompt, new = words[i % 6], 4 + i % 5
        kinds = [
            {"prompt": prompt, "max_tokens": new, "temperature": 0},
            {"prompt": prompt, "max_tokens": new, "temperature": 0, "logprobs": 2, "echo": True},
            {"prompt": [prompt, words[(i + 1) % 6]], "max_tokens": new, "temperature": 0},
            {"prompt": prompt, "max_tokens": new, "n": 2, "seed": i, "temperature": 1.0},
        ]
        return kinds[i % 4]

    def check(i: int, got: dict[str, Any]) -> None:
        b = body(i)
        prompts = b["prompt"] if isinstance(b["prompt"], list) else [b["prompt"]]
        texts = [ch["text"] for ch in got["choices"]]
        if "seed" in b:
            want = [
                generate(
                    m,
                    [tok.encode(prompts[0])],
                    max_new_tokens=b["max_tokens"],
                    sampling=sampling,
                    seed=i + j,
                )[0]
                for j in range(2)
            ]
            assert texts == [tok.decode(w) for w in want], i
            return
        want = [
            generate(m, [tok.encode(p)], max_new_tokens=b["max_tokens"], sampling=GREEDY)[0]
            for p in prompts
        ]
        echo = prompts[0] if b.get("echo") else ""
        assert texts == [echo + tok.decode(w) for w in want], i
        if b.get("logprobs") is not None:
            ids = [*tok.encode(prompts[0]), *want[0]]
            ref, logits = offline_logprobs(m, ids)
            lp = torch.tensor(got["choices"][0]["logprobs"]["token_logprobs"][1:])
            torch.testing.assert_close(lp, ref, atol=tolerance(torch.float32, logits), rtol=0)

    with served(create_app(m, tok, name="tiny", max_batch=16, max_queue=128)) as url:
        from concurrent.futures import ThreadPoolExecutor

        import httpx2 as httpx

        def post(i: int) -> dict[str, Any]:
            r = httpx.post(f"{url}/v1/completions", json=body(i), timeout=120)
            assert r.status_code == 200, r.text
            return r.json()

        with ThreadPoolExecutor(96) as pool:
            answers = list(pool.map(post, range(96)))
    for i, got in enumerate(answers):
        check(i, got)
