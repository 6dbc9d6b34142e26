"""Generation: cached = uncached, batched = one at a time, the samplers, seeds, errors."""

from __future__ import annotations

import pytest
import torch

from aiayn.generate import SamplingConfig, generate
from aiayn.generate.sampling import (
    apply_repetition_penalty,
    choose_next,
    next_token_distribution,
    top_k_filter,
    top_p_filter,
)
from aiayn.models import DecoderLM
from tests.conftest import tiny_model


def small(preset: str = "gpt2-small", **kw: object) -> DecoderLM:
    model = tiny_model(preset, **{"vocab_size": 40, "max_len": 48, "init_std": 0.2, **kw})
    assert isinstance(model, DecoderLM)
    return model


def naive_greedy(
    model: DecoderLM, prompt: list[int], n: int
) -> tuple[list[int], list[torch.Tensor]]:
    """Re-run the whole sequence for every token: no cache."""
    ids, logits = list(prompt), []
    for _ in range(n):
        step = model(torch.tensor([ids]))[0, -1]
        logits.append(step)
        ids.append(int(step.argmax()))
    return ids[len(prompt) :], logits


@pytest.mark.parametrize("preset", ["gpt2-small", "llama-style-small"])
def test_cached_equals_uncached_token_and_logit(preset: str) -> None:
    model = small(preset)
    prompt = [3, 14, 15, 9, 2]
    expected, expected_logits = naive_greedy(model, prompt, 20)
    assert generate(model, [prompt], max_new_tokens=20, sampling=SamplingConfig(temperature=0)) == [
        expected
    ]
    cache = model.new_cache(1, 30)
    step = model(torch.tensor([prompt]), cache=cache)[0, -1]
    for i, token in enumerate(expected):
        # fp32, cached vs full pass: 64-term dots move up to 64 x 2^-24 ~ 4e-6; CPU: <= 1.9e-6
        torch.testing.assert_close(step, expected_logits[i], atol=1e-5, rtol=1e-5)
        step = model(torch.tensor([[token]]), cache=cache)[0, -1]


@pytest.mark.parametrize("preset", ["gpt2-small", "llama-style-small"])
def test_left_padded_batch_equals_one_at_a_time(preset: str) -> None:
    model = small(preset)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [1], [20, 21, 22]]
    greedy = SamplingConfig(temperature=0)
    batched = generate(model, prompts, max_new_tokens=12, sampling=greedy)
    assert batched == [generate(model, [p], max_new_tokens=12, sampling=greedy)[0] for p in prompts]


def test_top_k_one_is_greedy() -> None:
    model = small()
    prompts = [[1, 2, 3], [4]]
    greedy = generate(model, prompts, max_new_tokens=10, sampling=SamplingConfig(temperature=0))
    top1 = generate(model, prompts, max_new_tokens=10, sampling=SamplingConfig(top_k=1), seed=3)
    assert top1 == greedy


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = lambda p: (top_p_filter(logits, p) > float("-inf")).int().tolist()[0]  # noqa: E731
    assert kept(0.5) == [1, 0, 0, 0]
    assert kept(0.79) == [1, 1, 0, 0]
    assert kept(0.81) == [1, 1, 1, 0]
    assert kept(0.96) == [1, 1, 1, 1]
    shuffled = logits[:, [2, 0, 3, 1]]  # order in the vocabulary does not matter
    assert (top_p_filter(shuffled, 0.79) > float("-inf")).int().tolist()[0] == [0, 1, 0, 1]
    # A p that is 0 in fp32 (found by fuzzing the server) keeps the most likely token, as
    # any p > 0 must, rather than none (a NaN distribution).
    for tiny in (5e-324, 1e-46, 1e-300):
        assert kept(tiny) == [1, 0, 0, 0]
        assert choose_next(logits, SamplingConfig(top_p=tiny)).item() == 0


def test_temperature_scales_the_softmax_and_a_tiny_one_is_greedy() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    p = next_token_distribution(logits, SamplingConfig(temperature=2.0))
    torch.testing.assert_close(p, torch.softmax(logits / 2.0, -1))  # softmax(l / T)
    # l / T overflows to inf for a tiny T, and softmax(inf, ...) is NaN; the limit is greedy.
    for t in (1e-300, 1e-46, 1e-45, 1e-38, 1e-30):  # 1e-46 and below are 0 in fp32: 0/0
        p = next_token_distribution(logits, SamplingConfig(temperature=t))
        assert p.tolist() == [[0.0, 1.0, 0.0, 0.0]]
        assert choose_next(logits, SamplingConfig(temperature=t)).item() == 1


def test_top_k_and_repetition_penalty() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    assert (top_k_filter(logits, 2) > float("-inf")).int().tolist()[0] == [0, 1, 1, 0]
    seen = torch.tensor([[False, True, False, True]])
    assert apply_repetition_penalty(logits, seen, 2.0).tolist()[0] == [1.0, 1.5, 2.0, -2.0]
    assert choose_next(logits, SamplingConfig(temperature=0), seen=seen).item() == 1
    assert (
        choose_next(logits, SamplingConfig(temperature=0, repetition_penalty=2.0), seen=seen).item()
        == 2
    )


def test_same_seed_same_sample() -> None:
    model = small()
    kw = dict(max_new_tokens=15, sampling=SamplingConfig(temperature=1.0, top_p=0.9))
    a = generate(model, [[1, 2]], seed=7, **kw)  # type: ignore[arg-type]
    assert a == generate(model, [[1, 2]], seed=7, **kw)  # type: ignore[arg-type]
    assert a != generate(model, [[1, 2]], seed=8, **kw)  # type: ignore[arg-type]


def test_sampling_follows_the_distribution() -> None:
    logits = torch.tensor([[0.0, 0.0, 2.0]]).expand(4000, 3)
    g = torch.Generator().manual_seed(0)
    draws = choose_next(logits, SamplingConfig(), generator=g)
    freq = torch.bincount(draws, minlength=3).float() / 4000
    # 4000 draws: a frequency near 0.79 has s.d. sqrt(0.79 x 0.21 / 4000) ~ 0.0065; 0.03 ~ 4.6 s.d.
    torch.testing.assert_close(freq, torch.tensor([0.0, 0.0, 2.0]).softmax(0), atol=0.03, rtol=0)


def test_eos_and_stop_strings() -> None:
    model = small()
    greedy = SamplingConfig(temperature=0)
    free = generate(model, [[1, 2, 3]], max_new_tokens=10, sampling=greedy)[0]
    eos = free[3]
    cut = generate(model, [[1, 2, 3]], max_new_tokens=10, sampling=greedy, eos_id=eos)[0]
    assert cut == free[: free.index(eos) + 1]
    decode = lambda ids: "".join(chr(65 + i % 26) for i in ids)  # noqa: E731
    stop = decode(free[2:4])
    out = generate(
        model, [[1, 2, 3]], max_new_tokens=10, sampling=greedy, stop=[stop], decode=decode
    )[0]
    assert stop in decode(out) and len(out) <= free.index(free[3]) + 1 + 2


def test_prompt_too_long_errors_or_truncates() -> None:
    model = small()  # max_len 48
    long = list(range(1, 40)) + [1] * 10
    with pytest.raises(ValueError, match="at most 48"):
        generate(model, [long], max_new_tokens=10)
    out = generate(
        model, [long], max_new_tokens=10, truncate=True, sampling=SamplingConfig(temperature=0)
    )
    assert out == generate(
        model, [long[-48:]], max_new_tokens=10, sampling=SamplingConfig(temperature=0)
    )
    with pytest.raises(ValueError, match="empty"):
        generate(model, [[]], max_new_tokens=3)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=1.5)


def sliding_reference(model: DecoderLM, prompt: list[int], n: int) -> list[int]:
    """Greedy continuation without a cache, re-running the whole window every step.

    The window is the documented policy of ``stream``: once the context would exceed max_len,
    keep its last max_len - 1 tokens; then let it grow to max_len again.
    """
    max_len = model.config.max_len
    ids, start = list(prompt), 0
    for _ in range(n):
        if len(ids) - start > max_len:
            start = len(ids) - max_len + 1
        window = torch.tensor([ids[start:]])  # (1, W)
        ids.append(int(model(window)[0, -1].argmax()))
    return ids[len(prompt) :]


def test_generation_slides_past_max_len_like_nanogpt() -> None:
    # max_len 48; larger weights than the default, so that the oldest tokens sway the argmax
    model = small(init_std=0.5)
    greedy = SamplingConfig(temperature=0)
    torch.manual_seed(1)
    prompts = [torch.randint(1, 40, (n,)).tolist() for n in (30, 25, 7)]
    # 40 new tokens: the 30-token row's context passes max_len after 18 steps, the 25-token
    # row's after 23; the 7-token row's never does (7 + 40 < 48) but shares the batch's cache.
    batched = generate(model, prompts, max_new_tokens=40, sampling=greedy)
    for prompt, row in zip(prompts, batched, strict=True):
        alone = generate(model, [prompt], max_new_tokens=40, sampling=greedy)[0]
        assert row == alone  # left padding changes nothing, sliding included
        assert row == sliding_reference(model, prompt, 40)
    # A long continuation slides many times (every row, out of phase with each other).
    long = generate(model, prompts[:2], max_new_tokens=70, sampling=greedy)
    for prompt, row in zip(prompts[:2], long, strict=True):
        assert row == sliding_reference(model, prompt, 70)


@pytest.mark.parametrize("how", ["generate", "stream"])
def test_decoding_records_no_autograd_graph(how: str) -> None:
    """Generation runs without gradients: with them, every step keeps a graph alive and
    training's attention kernel (with its own backward) replaces the inference one."""
    from aiayn.generate.lm import stream

    model = small()
    grad_during_forward: list[bool] = []
    model.register_forward_hook(lambda *_: grad_during_forward.append(torch.is_grad_enabled()))
    greedy = SamplingConfig(temperature=0)
    if how == "generate":
        generate(model, [[1, 2, 3]], max_new_tokens=3, sampling=greedy)
    else:
        list(stream(model, [[1, 2, 3]], max_new_tokens=3, sampling=greedy))
    assert grad_during_forward and not any(grad_during_forward)


def test_the_prefill_projects_only_the_last_position() -> None:
    """A prompt's prefill needs the next-token logits of its last position alone: the output
    projection (the widest product, V columns) sees one row per sequence, not one per prompt
    token, and the last position's logits are those of the whole forward's last position
    (to fp32 rounding: one row and many take different kernels)."""
    model = small()
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        last = model(ids, last_only=True)
        every = model(ids)
    assert last.shape == (2, 1, 40)
    torch.testing.assert_close(last[:, 0], every[:, -1])
    rows: list[int] = []
    hook = model.head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[1]))
    try:
        generate(model, ids.tolist(), max_new_tokens=3, sampling=SamplingConfig(temperature=0))
    finally:
        hook.remove()
    assert rows[0] == 1  # the prefill, then one per step
