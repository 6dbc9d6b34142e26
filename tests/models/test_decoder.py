"""Decoder-only LM: causal leaks, cache, left padding, attention weights."""

from __future__ import annotations

import pytest
import torch

import aiayn
from aiayn.models import DecoderLM
from tests.conftest import tiny_model

# fp32 summed in another order: a 64-term dot moves up to 64 x 2^-24 ~ 4e-6; CPU: <= 1.8e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}
VARIANTS = {
    "gpt2": ("gpt2-small", {}),
    "llama": ("llama-style-small", {"attention.n_kv_heads": 2}),
    "sinusoid-postln": ("gpt2-small", {"positions.scheme": "sinusoidal", "norm_position": "post"}),
    "alibi": ("gpt2-small", {"positions.scheme": "alibi"}),
    "alibi-gqa": ("llama-style-small", {"positions.scheme": "alibi", "attention.n_kv_heads": 2}),
}


def small(name: str) -> DecoderLM:
    preset, kw = VARIANTS[name]
    model = tiny_model(preset, vocab_size=60, max_len=32, **kw)
    assert isinstance(model, DecoderLM)
    return model


@pytest.mark.parametrize("name", VARIANTS)
def test_causal_mask_leaks_nothing_gradient(name: str) -> None:
    model = small(name)
    ids = torch.randint(0, 60, (1, 10))
    x, ctx = model.embed_context(model.embed, ids, None, None, causal=True, record=None)
    emb = x.detach().requires_grad_(True)
    h = model.decoder(emb, ctx)  # (1, T, C)
    probe = torch.randn(h.shape[-1])  # not .sum(): a LayerNorm output always sums to sum(beta)
    for t in (0, 4, 8):
        (grad,) = torch.autograd.grad(h[0, t] @ probe, emb, retain_graph=True)
        assert grad[0, t + 1 :].abs().max() == 0.0  # exactly zero, not merely small
        assert grad[0, : t + 1].abs().max() > 0.0


@pytest.mark.parametrize("name", VARIANTS)
def test_cached_equals_uncached(name: str) -> None:
    model = small(name)
    ids = torch.randint(0, 60, (3, 12))
    full = model(ids)
    cache = model.new_cache(3, 16)
    parts = [model(ids[:, :5], cache=cache)] + [
        model(ids[:, i : i + 1], cache=cache) for i in range(5, 12)
    ]
    torch.testing.assert_close(torch.cat(parts, 1), full, **TOL)


@pytest.mark.parametrize("name", VARIANTS)
def test_left_padding_equals_one_at_a_time(name: str) -> None:
    model = small(name)
    a, b = torch.randint(1, 60, (1, 7)), torch.randint(1, 60, (1, 4))
    batch = torch.cat([a, torch.cat([torch.zeros(1, 3, dtype=torch.long), b], 1)])
    mask = batch != 0
    mask[0] = True
    out = model(batch, attention_mask=mask)
    torch.testing.assert_close(out[0], model(a)[0], **TOL)
    torch.testing.assert_close(out[1, 3:], model(b)[0], **TOL)
    # ... and continues correctly with a cache.
    cache = model.new_cache(2, 12)
    model(batch, attention_mask=mask, cache=cache)
    nxt = torch.tensor([[5], [9]])
    step = model(nxt, cache=cache)
    torch.testing.assert_close(step[1], model(torch.cat([b, nxt[1:]], 1))[0, -1:], **TOL)
    torch.testing.assert_close(step[0], model(torch.cat([a, nxt[:1]], 1))[0, -1:], **TOL)


def test_attention_weights() -> None:
    model = small("llama")
    ids = torch.randint(0, 60, (2, 6))
    logits, weights = model.forward_with_weights(ids)
    torch.testing.assert_close(logits, model(ids), **TOL)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 6, 6)
    assert (weights[1].triu(1) == 0).all()


def test_tying_and_bad_inputs() -> None:
    model = small("gpt2")
    assert model.head.weight is model.embed.token.weight
    assert small("llama").head.weight is not small("llama").embed.token.weight
    with pytest.raises(ValueError, match="max_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    cache = model.new_cache(1, 32)
    model(torch.zeros(1, 30, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="max_len=32"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    with pytest.raises(ValueError, match="attention_mask"):
        model(
            torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4, dtype=torch.bool)
        )
    with pytest.raises(ValueError, match="capacity"):
        model.new_cache(1, 64)


def test_dropout_only_in_training() -> None:
    model = aiayn.build_model(
        "gpt2-small",
        n_layers=2,
        d_model=32,
        attention={"n_heads": 4, "dropout": 0.1},
        ffn={"d_ff": 64},
        vocab_size=60,
        max_len=32,
        dropout=0.1,
    )
    ids = torch.randint(0, 60, (2, 8))
    model.eval()
    torch.testing.assert_close(model(ids), model(ids))
    model.train()
    assert not torch.allclose(model(ids), model(ids))
    # Attention-weight dropout alone also changes the training output.
    only_attn = aiayn.build_model(model.config.replace(dropout=0.0)).train()
    assert not torch.allclose(only_attn(ids), only_attn(ids))
    no_dropout = aiayn.build_model(
        model.config.replace(dropout=0.0, attention={"dropout": 0.0})
    ).train()
    torch.testing.assert_close(no_dropout(ids), no_dropout(ids))
