"""Rotary position embeddings, RoPE (Su et al., 2021): rotate each (x_i, x_{i+D/2}) pair of
queries and keys by an angle proportional to the position, so that q·k depends on the offset
only.  ``rope_scaling`` > 1 divides positions (linear position interpolation, Chen et al.,
2023) to stretch a model to longer contexts.  Uses the "rotate half" layout of GPT-NeoX and
HF Llama so that their weights load unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.config import PositionConfig
from aiayn.errors import UserError
from aiayn.nn.positions.base import PositionScheme, PositionSizes, PositionState, check_positions


class RotaryEmbedding(nn.Module):
    """RoPE angles for a head size ``dim``; ``forward`` gives (cos, sin) for positions."""

    cos_table: Tensor
    sin_table: Tensor

    def __init__(self, dim: int, max_len: int, base: float = 10000.0, scaling: float = 1.0) -> None:
        super().__init__()
        if dim % 2:
            raise UserError(f"rotary head size must be even, got {dim}")
        self.dim, self.max_len, self.base, self.scaling = dim, max_len, base, scaling
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))  # (D/2,)
        angles = (
            torch.arange(max_len, dtype=torch.float64)[:, None] / scaling
        ) * inv_freq  # (P, D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (P, D): "rotate half" layout
        self.register_buffer("cos_table", angles.cos().float(), persistent=False)
        self.register_buffer("sin_table", angles.sin().float(), persistent=False)

    def forward(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(T,) or (B, T) positions -> cos, sin shaped (1|B, 1, T, D) to broadcast over heads."""
        check_positions(positions, self.max_len)
        cos, sin = self.cos_table[positions], self.sin_table[positions]  # (.., T, D)
        if positions.dim() == 1:
            return cos[None, None], sin[None, None]
        return cos[:, None], sin[:, None]


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (B, H, T, D) queries or keys by the angles of their positions."""
    return (x * cos.to(x.dtype)) + (rotate_half(x) * sin.to(x.dtype))


class _Rotation(PositionState):
    def __init__(self, cos: Tensor, sin: Tensor) -> None:
        self.cos, self.sin = cos, sin

    def on_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin)


class RotaryPositions(PositionScheme):
    """RoPE on queries and keys of self-attention; nothing added to the embeddings."""

    def __init__(self, positions: PositionConfig, sizes: PositionSizes) -> None:
        super().__init__(positions, sizes)
        d, p = sizes.head_dim, positions
        if d % 2:
            raise UserError(f"rotary positions need an even head size, got {d}")
        self.rotary = RotaryEmbedding(d, sizes.max_len, p.rope_base, p.rope_scaling)

    def state(self, q_positions: Tensor, k_positions: Tensor) -> PositionState:
        # New keys sit at the query positions; cached keys were rotated when they were new.
        return _Rotation(*self.rotary(q_positions))
