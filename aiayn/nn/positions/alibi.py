"""ALiBi, attention with linear biases (Press et al., 2022): no position vectors at all; each
head adds ``-m_h · |i - j|`` to the score of query i for key j, so attention fades with
distance at a per-head rate.  The slopes m_h form a geometric sequence, 2^(-8/H), 2^(-16/H),
..., 2^(-8); for H not a power of two, the paper takes the 2^⌊log2 H⌋ slopes and fills in
every other slope of the next power of two.

Because nothing depends on absolute positions, a model trained on short sequences can be run
on longer ones (the paper's point: "train short, test long"); max_len only bounds the cache.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from aiayn.config import PositionConfig
from aiayn.nn.positions.base import PositionScheme, PositionSizes, PositionState


def alibi_slopes(n_heads: int) -> Tensor:
    """(H,) slopes of the paper: 2^(-8 h / H) for h = 1..H when H is a power of two."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest < n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


class _Bias(PositionState):
    def __init__(self, slopes: Tensor, q_positions: Tensor, k_positions: Tensor) -> None:
        self.slopes, self.q, self.k = slopes, q_positions, k_positions

    def score_bias(self) -> Tensor:
        q = self.q if self.q.dim() == 2 else self.q[None]  # (B|1, T)
        k = self.k if self.k.dim() == 2 else self.k[None]  # (B|1, S)
        distance = (q[:, :, None] - k[:, None, :]).abs()  # (B|1, T, S)
        return -self.slopes[None, :, None, None] * distance[:, None]  # (B|1, H, T, S)


class ALiBi(PositionScheme):
    slopes: Tensor

    def __init__(self, positions: PositionConfig, sizes: PositionSizes) -> None:
        super().__init__(positions, sizes)
        self.register_buffer("slopes", alibi_slopes(sizes.n_heads), persistent=False)

    def state(self, q_positions: Tensor, k_positions: Tensor) -> PositionState:
        return _Bias(self.slopes, q_positions, k_positions)
