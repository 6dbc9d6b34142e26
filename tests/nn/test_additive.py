"""Additive (Bahdanau) attention: the scores by hand, the masks, grouped-query heads."""

from __future__ import annotations

import math

import torch

from aiayn.nn.additive import additive_attention, additive_scores
from aiayn.nn.attention import AttentionCall

PLAIN = AttentionCall(scale=1.0)  # additive scores have no scale


def hand_scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """v^T tanh(W s + U h) of Bahdanau et al. (2015), one query and key at a time."""
    b, h, t, d = q.shape
    s = k.shape[2]
    out = torch.zeros(b, h, t, s, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for ti in range(t):
                for si in range(s):
                    out[bi, hi, ti, si] = sum(
                        float(w[hi, j]) * math.tanh(float(q[bi, hi, ti, j] + k[bi, hi, si, j]))
                        for j in range(d)
                    )
    return out


def test_scores_and_output_equal_the_formula_by_hand() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    w = torch.randn(2, 4)
    expected = hand_scores(q, k, w)
    # All three: fp32 vs fp64, 2^-24 ~ 6e-8 per op over 4-term sums, tanh, softmax: ~1e-6; 10x.
    torch.testing.assert_close(additive_scores(q, k, w).double(), expected, atol=1e-5, rtol=1e-5)
    out, weights = additive_attention(q, k, v, w, PLAIN)
    ref_w = torch.softmax(expected, dim=-1)
    torch.testing.assert_close(weights.double(), ref_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), ref_w @ v.double(), atol=1e-5, rtol=1e-5)


def test_masks_causality_and_dead_rows() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    w = torch.randn(2, 3)
    _, weights = additive_attention(q, k, v, w, AttentionCall(scale=1.0, causal=True))
    assert torch.all(weights.triu(1) == 0)  # no query sees a later key
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, 4))
    keep = torch.tensor([True, True, False, False]).view(1, 1, 1, 4)
    _, weights = additive_attention(q, k, v, w, AttentionCall(scale=1.0, mask=keep))
    assert torch.all(weights[..., 2:] == 0)
    none = torch.zeros(1, 1, 1, 4, dtype=torch.bool)
    out, weights = additive_attention(q, k, v, w, AttentionCall(scale=1.0, mask=none))
    assert torch.all(out == 0) and torch.all(weights == 0)  # zeros, not NaN


def test_grouped_query_heads_share_their_key_value_head() -> None:
    torch.manual_seed(2)
    q, k, v = torch.randn(1, 4, 3, 2), torch.randn(1, 2, 5, 2), torch.randn(1, 2, 5, 2)
    w = torch.randn(4, 2)
    out, _ = additive_attention(q, k, v, w, PLAIN)
    full_k, full_v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    ref, _ = additive_attention(q, full_k, full_v, w, PLAIN)
    torch.testing.assert_close(out, ref)
