"""Linear attention: the chunked parallel form and the recurrent form equal the O(T²) formula
and each other; causal, padding-proof, flat in memory; hybrids; the calculator."""

from __future__ import annotations

import pytest
import torch

import aiayn
from aiayn.inspect.calc import kv_cache_bytes, recurrent_state_bytes
from aiayn.models import DecoderLM
from aiayn.nn.linear_attention import (
    EPS,
    LinearSelfAttention,
    feature_map,
    linear_attention,
    linear_attention_reference,
)

SMALL = {
    "n_layers": 4,
    "d_model": 32,
    "attention.n_heads": 4,
    "ffn.d_ff": 64,
    "vocab_size": 50,
    "max_len": 256,
    "dropout": 0.0,
}


def lm(**kw: object) -> DecoderLM:
    torch.manual_seed(0)
    m = aiayn.build_model("gpt2-small", **{**SMALL, "mixer.kind": "linear", **kw})
    assert isinstance(m, DecoderLM)
    return m.eval()


def by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """out_i = sum_{j<=i} (phi(q_i).phi(k_j)) v_j / sum_{j<=i} phi(q_i).phi(k_j), one i at a time
    (with the implementation's documented EPS in the denominator)."""
    fq, fk = feature_map(q), feature_map(k)
    out = torch.zeros_like(v)
    for i in range(q.shape[2]):
        w = (fq[:, :, i : i + 1] * fk[:, :, : i + 1]).sum(-1)  # (B, H, i+1)
        out[:, :, i] = (w[..., None] * v[:, :, : i + 1]).sum(2) / (w.sum(-1, keepdim=True) + EPS)
    return out


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_parallel_and_recurrent_forms_equal_the_formula(chunk: int) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 40, 8, dtype=torch.float64) for _ in range(3))
    expected = by_hand(q, k, v)
    out, state = linear_attention(q, k, v, chunk=chunk)
    # fp64 rounding is ~1e-15; these still fail if EPS=1e-6 were dropped (3e-7 here).
    torch.testing.assert_close(out, expected, atol=1e-9, rtol=1e-7)
    torch.testing.assert_close(linear_attention_reference(q, k, v), expected, atol=1e-9, rtol=1e-7)
    # The state after all 40 positions: S = sum phi(k_j) v_j^T, z = sum phi(k_j).
    torch.testing.assert_close(state.s, feature_map(k).transpose(-1, -2) @ v)
    torch.testing.assert_close(state.z, feature_map(k).sum(2))
    # Recurrent: pieces of any size, carrying the state, give the same outputs.
    pieces, st, start = [], None, 0
    for size in (1, 5, 1, 13, 20):
        o, st = linear_attention(
            q[:, :, start : start + size],
            k[:, :, start : start + size],
            v[:, :, start : start + size],
            state=st,
        )
        pieces.append(o)
        start += size
    torch.testing.assert_close(torch.cat(pieces, 2), expected, atol=1e-9, rtol=1e-7)  # as above


def test_padding_adds_nothing_and_grouped_heads_share() -> None:
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    keep = torch.tensor([[False, False, True, True, True, True]])
    padded, _ = linear_attention(q, k, v, keep=keep)
    alone, _ = linear_attention(q[:, :, 2:], k[:, :, 2:], v[:, :, 2:])
    torch.testing.assert_close(padded[:, :, 2:], alone)
    k2, v2 = k[:, :2], v[:, :2]
    shared, _ = linear_attention(q, k2, v2)
    full, _ = linear_attention(q, k2.repeat_interleave(2, 1), v2.repeat_interleave(2, 1))
    torch.testing.assert_close(shared, full)


@pytest.mark.parametrize("every", [None, 2])
def test_model_cached_decoding_causality_and_left_padding(every: int | None) -> None:
    m = lm(mixer={"attention_every": every})
    kinds = [type(b.self_attn) is LinearSelfAttention for b in m.decoder.blocks]
    assert kinds == ([True] * 4 if every is None else [True, False, True, False])
    ids = torch.randint(1, 50, (2, 30))
    full = m(ids)
    cache = m.new_cache(2, 30)
    steps = [m(ids[:, :7], cache=cache)] + [m(ids[:, i : i + 1], cache=cache) for i in range(7, 30)]
    # fp32, cached steps sum in another order: 32 x 2^-23 ~ 4e-6 per 32-wide sum, 4 layers.
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    changed = ids.clone()
    changed[:, 20:] = (changed[:, 20:] + 3) % 50
    torch.testing.assert_close(m(changed)[:, :20], full[:, :20])  # nothing leaks backwards
    padded = torch.cat([torch.zeros(2, 3, dtype=torch.long), ids[:, :10]], 1)
    keep = torch.cat([torch.zeros(2, 3, dtype=torch.bool), torch.ones(2, 10, dtype=torch.bool)], 1)
    torch.testing.assert_close(  # as the cached steps
        m(padded, attention_mask=keep)[:, 3:], m(ids[:, :10]), atol=1e-5, rtol=1e-5
    )


def test_decoding_memory_is_flat_and_the_calculator_agrees() -> None:
    """A pure linear-attention model keeps no keys: its cache after 200 tokens is the size it
    was after 10; a hybrid's grows only with its softmax layers.  aiayn calc predicts both."""
    for every in (None, 2):
        m = lm(mixer={"attention_every": every})
        sizes = []
        for n in (10, 200):
            cache = m.new_cache(1, n)
            m(torch.randint(1, 50, (1, n)), cache=cache)
            sizes.append(cache.nbytes())
            assert cache.nbytes() == kv_cache_bytes(m.config, n, 1, "float32")
        assert (sizes[0] == sizes[1]) == (every is None)
    assert recurrent_state_bytes(lm().config) == 4 * 4 * 8 * 9 * 4  # layers x heads x D(D+1) x fp32


def test_bad_configs_are_named() -> None:
    with pytest.raises(
        ValueError,
        match="mixer.kind='linear' is invalid: expected 'attention' for arch='encoder-decoder'",
    ):
        aiayn.build_model("paper-base", mixer={"kind": "linear"})
    with pytest.raises(ValueError, match="positions.scheme='alibi' is invalid"):
        aiayn.build_model("gpt2-small", mixer={"kind": "linear"}, positions={"scheme": "alibi"})
    with pytest.raises(ValueError, match="attention.sliding_window=8 is invalid"):
        aiayn.build_model("gpt2-small", mixer={"kind": "linear"}, attention={"sliding_window": 8})
    with pytest.raises(ValueError, match="attention_every=2 is invalid"):
        aiayn.build_model("gpt2-small", mixer={"attention_every": 2})
