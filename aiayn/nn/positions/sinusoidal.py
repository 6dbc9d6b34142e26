"""The paper's fixed sinusoids (§3.5), added to the embeddings.

``PE(pos, 2i) = sin(pos / 10000^(2i/d))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d))``.  For any
offset k, PE(pos + k) is a fixed linear map (a rotation of each (sin, cos) pair) of PE(pos) --
the property the paper cites for attending by relative position.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from aiayn.config import PositionConfig
from aiayn.nn.positions.base import PositionScheme, PositionSizes, check_positions


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """(max_len, d_model) table of §3.5, sin on even and cos on odd dimensions."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = torch.exp(
        -math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model
    )  # (D/2,)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: d_model // 2])
    return table.float()


class SinusoidalPositions(PositionScheme):
    """Fixed sinusoids added to the embeddings (§3.5).  No parameters."""

    table: Tensor

    def __init__(self, positions: PositionConfig, sizes: PositionSizes) -> None:
        super().__init__(positions, sizes)
        table = sinusoidal_table(sizes.max_len, sizes.d_model)
        self.register_buffer("table", table, persistent=False)

    def embed(self, positions: Tensor) -> Tensor:
        check_positions(positions, self.max_len)
        return self.table[positions]  # (T, C) or (B, T, C)
