"""The selective state-space layer: the chunked scan equals the recurrence, step-by-step
decoding equals the full pass, padding and the future change nothing, memory is flat."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import aiayn
from aiayn.inspect.calc import kv_cache_bytes
from aiayn.models import DecoderLM
from aiayn.nn.ssm import SelectiveSSM, selective_scan, selective_scan_reference

SMALL = dict(n_layers=4, d_model=32, n_heads=4, d_ff=64, vocab_size=50, max_len=256, dropout=0.0)


def lm(**kw: object) -> DecoderLM:
    torch.manual_seed(0)
    m = aiayn.build_model("gpt2-small", **{**SMALL, "mixer": "ssm", **kw})
    assert isinstance(m, DecoderLM)
    return m.eval()


@pytest.mark.parametrize("split", [1, 5, 20])
def test_scan_equals_the_recurrence_and_carries_its_state(split: int) -> None:
    torch.manual_seed(0)
    b, t, e, n = 2, 37, 6, 4
    x, b_, c = (torch.randn(b, t, k, dtype=torch.float64) for k in (e, n, n))
    delta = torch.rand(b, t, e, dtype=torch.float64)
    a = -torch.rand(e, n, dtype=torch.float64) * 2
    d = torch.randn(e, dtype=torch.float64)
    expected = selective_scan_reference(x, delta, a, b_, c, d)
    y, h = selective_scan(x, delta, a, b_, c, d)
    torch.testing.assert_close(y, expected)
    # The state carries: two calls equal one.
    y1, h1 = selective_scan(x[:, :split], delta[:, :split], a, b_[:, :split], c[:, :split], d)
    y2, h2 = selective_scan(x[:, split:], delta[:, split:], a, b_[:, split:], c[:, split:], d, h1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), expected)
    torch.testing.assert_close(h2, h)


@pytest.mark.parametrize("every", [None, 2])
def test_step_by_step_equals_full_sequence_and_nothing_leaks(every: int | None) -> None:
    m = lm(attention_every=every)
    kinds = [type(b.self_attn) is SelectiveSSM for b in m.decoder.blocks]
    assert kinds == ([True] * 4 if every is None else [True, False, True, False])
    ids = torch.randint(1, 50, (2, 30))
    full = m(ids)
    cache = m.new_cache(2, 30)
    steps = [m(ids[:, :7], cache=cache)] + [m(ids[:, i : i + 1], cache=cache) for i in range(7, 30)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    changed = ids.clone()
    changed[:, 20:] = (changed[:, 20:] + 3) % 50
    torch.testing.assert_close(m(changed)[:, :20], full[:, :20])
    padded = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids[:, :10]], 1)
    keep = torch.cat([torch.zeros(2, 3, dtype=torch.bool), torch.ones(2, 10, dtype=torch.bool)], 1)
    torch.testing.assert_close(
        m(padded, attention_mask=keep)[:, 3:], m(ids[:, :10]), atol=1e-5, rtol=1e-5
    )


def test_decoding_memory_is_flat_and_the_calculator_agrees() -> None:
    for every in (None, 2):
        m = lm(attention_every=every)
        sizes = []
        for n in (10, 200):
            cache = m.new_cache(1, n)
            m(torch.randint(1, 50, (1, n)), cache=cache)
            sizes.append(cache.nbytes())
            assert cache.nbytes() == kv_cache_bytes(m.config, n, 1, "float32")
        assert (sizes[0] == sizes[1]) == (every is None)


def test_mambas_initialisation_survives_and_the_layer_learns() -> None:
    m = lm().train()
    layer = m.decoder.blocks[0].self_attn
    assert isinstance(layer, SelectiveSSM)
    steps = F.softplus(layer.dt_proj.bias.detach())
    assert float(steps.min()) >= 1e-3 * 0.999 and float(steps.max()) <= 0.1 * 1.001
    torch.testing.assert_close(-layer.a_log.exp()[0], -torch.arange(1.0, 17.0))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    ids = torch.randint(1, 50, (4, 32))
    losses = []
    for _ in range(10):
        loss = m(ids[:, :-1], targets=ids[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5
    assert layer.a_log.grad is None  # zero_grad sets it to None; one more backward pass:
    loss = m(ids[:, :-1], targets=ids[:, 1:])
    loss.backward()
    assert layer.a_log.grad is not None and layer.a_log.grad.abs().sum() > 0
