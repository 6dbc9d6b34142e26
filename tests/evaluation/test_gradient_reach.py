"""The gradient-reach measurement: exact zeros beyond a sliding window's reach, a recurrence
reaching everything, and batching that changes nothing."""

from __future__ import annotations

import math

import torch

import aiayn
from aiayn.evaluation.gradient_reach import gradient_by_distance
from aiayn.models import EncoderDecoder

SMALL = {
    "d_model": 32,
    "attention.n_heads": 4,
    "ffn.d_ff": 64,
    "vocab_size": 40,
    "max_len": 64,
    "dropout": 0.0,
}


def model(**kw: object) -> EncoderDecoder:
    torch.manual_seed(0)
    m = aiayn.build_model("paper-base", **{**SMALL, **kw})
    assert isinstance(m, EncoderDecoder)
    return m


def batch(n: int, s: int, t: int, seed: int = 1) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 40, (n, s), generator=g)
    tgt = torch.randint(3, 40, (n, t + 1), generator=g)
    return src, tgt[:, :-1], tgt[:, 1:]


def test_a_sliding_window_bounds_the_reach_exactly() -> None:
    """With a causal window of w keys in each of L decoder layers, position t reads inputs at
    most L (w - 1) back: beyond that the gradient is exactly zero; within it, not."""
    for layers, window in ((1, 3), (2, 3), (2, 5)):
        m = model(n_layers=layers, attention={"sliding_window": window})
        means, counts = gradient_by_distance(m, [batch(3, 6, 14)], pad_id=0, max_distance=13)
        reach = layers * (window - 1)
        assert all(v > 0 for v in means[: reach + 1]), (layers, window, means)
        assert all(v == 0 for v in means[reach + 1 :]), (layers, window, means)
        assert counts == [3] * 14


def test_full_attention_and_recurrence_reach_every_position() -> None:
    for kw in (
        {"n_layers": 2},
        {"n_layers": 1, "rnn.cell": "gru"},
        {"n_layers": 1, "rnn.cell": "lstm"},
    ):
        means, _ = gradient_by_distance(model(**kw), [batch(2, 5, 12)], pad_id=0, max_distance=11)
        assert all(v > 0 and math.isfinite(v) for v in means), (kw, means)


def test_padding_and_batching_change_nothing() -> None:
    """Two sentences of different lengths padded into one batch measure what each measures
    alone; the shorter one stops contributing beyond its own length."""
    m = model(n_layers=2, rnn={"cell": "gru"})
    src, tgt_in, tgt_out = batch(2, 6, 9)
    tgt_out[1, 5:] = 0  # the second sentence ends at position 4
    tgt_in[1, 6:] = 0
    together, counts = gradient_by_distance(m, [(src, tgt_in, tgt_out)], pad_id=0, max_distance=8)
    a, _ = gradient_by_distance(m, [(src[:1], tgt_in[:1], tgt_out[:1])], pad_id=0, max_distance=8)
    b, _ = gradient_by_distance(
        m, [(src[1:], tgt_in[1:, :5], tgt_out[1:, :5])], pad_id=0, max_distance=8
    )
    assert counts == [2] * 5 + [1] * 4
    for k in range(9):
        expected = (a[k] + b[k]) / 2 if k < 5 else a[k]
        # fp32 gradients of a padded batch vs alone: ~80 ulps (2^-23); seen 2 % of that on CPU
        assert math.isclose(together[k], expected, rel_tol=1e-5), k
