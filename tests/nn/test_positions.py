"""Positions: the sinusoid's relative-offset property, RoPE's relative scores, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.config import PositionConfig
from aiayn.nn.positions import (
    LearnedPositions,
    PositionSizes,
    RotaryEmbedding,
    SinusoidalPositions,
    apply_rotary,
    sinusoidal_table,
)


def test_sinusoid_matches_paper_formula() -> None:
    d = 16
    table = sinusoidal_table(50, d)
    for pos in (0, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            # An fp64 table cast to fp32: within 2^-25 ~ 3e-8 of values <= 1; ~30x room.
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("k", [1, 5, 17])
def test_sinusoid_offset_is_a_fixed_linear_map(k: int) -> None:
    # §3.5: PE(pos + k) = M_k PE(pos) with M_k independent of pos (a rotation per pair).
    d, n = 32, 100
    table = sinusoidal_table(n + k + 1, d).double()
    x, y = table[:n], table[k : n + k]  # PE(p), PE(p + k) for p = 0..n-1
    # M_k is a block-diagonal rotation built from k alone; one matrix serves every p.
    freqs = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.zeros(d, d, dtype=torch.float64)
    for i, w in enumerate(freqs):
        c, s = math.cos(k * w), math.sin(k * w)
        rot[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]])
    # fp32 table entries (within ~6e-8 of the sinusoid), 2-term rotations: ~1e-7; 20x room.
    torch.testing.assert_close(x @ rot, y, atol=2e-6, rtol=0)
    # k is not k+1: the fastest pair turns 1 rad a step, 2 sin(1/2) ~ 0.96 >> 1e-3.
    assert not torch.allclose(x @ rot, table[k + 1 : n + k + 1], atol=1e-3)


def _config(max_len: int, d: int) -> tuple[PositionConfig, PositionSizes]:
    return PositionConfig(), PositionSizes(max_len=max_len, d_model=d, n_heads=2, head_dim=d // 2)


def test_sinusoid_distinguishes_order() -> None:
    pe = SinusoidalPositions(*_config(16, 8))
    a = pe.embed(torch.tensor([0, 1, 2]))
    b = pe.embed(torch.tensor([2, 1, 0]))
    assert not torch.allclose(a, b)
    assert pe.embed(torch.tensor([[1, 2]])).shape == (1, 2, 8)


def test_rope_score_depends_only_on_offset() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 256)
    q, k = torch.randn(16), torch.randn(16)

    def score(i: int, j: int) -> float:
        cos, sin = rope(torch.tensor([i, j]))
        qi = apply_rotary(q.view(1, 1, 1, 16), cos[:, :, :1], sin[:, :, :1])
        kj = apply_rotary(k.view(1, 1, 1, 16), cos[:, :, 1:], sin[:, :, 1:])
        return (qi * kj).sum().item()

    for offset in (0, 3, 40):
        base = score(offset, 0)
        for shift in (1, 10, 100):
            # Scores up to |q||k| ~ 16, where an fp32 ulp is 2^-19 ~ 2e-6: ~50 ulps.
            assert score(offset + shift, shift) == pytest.approx(base, abs=1e-4)
    # But it does depend on the offset: 100x the bound above (measured 0.69).
    assert abs(score(1, 0) - score(20, 0)) > 1e-2


def test_rope_preserves_norm_and_scaling_interpolates() -> None:
    x = torch.randn(1, 2, 5, 8)
    rope = RotaryEmbedding(8, 64)
    cos, sin = rope(torch.arange(5))
    torch.testing.assert_close(apply_rotary(x, cos, sin).norm(dim=-1), x.norm(dim=-1))
    scaled = RotaryEmbedding(8, 64, scaling=4.0)
    c4, s4 = scaled(torch.tensor([8]))
    c1, s1 = rope(torch.tensor([2]))
    torch.testing.assert_close(c4, c1)
    torch.testing.assert_close(s4, s1)


def test_positions_beyond_max_len_raise() -> None:
    for module in (SinusoidalPositions(*_config(8, 4)), LearnedPositions(*_config(8, 4))):
        with pytest.raises(ValueError, match="max_len=8"):
            module.embed(torch.arange(9))
    with pytest.raises(ValueError, match="max_len=8"):
        RotaryEmbedding(4, 8)(torch.arange(9))
    with pytest.raises(ValueError, match="integer"):
        LearnedPositions(*_config(8, 4)).embed(torch.zeros(3))
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(5, 8)
