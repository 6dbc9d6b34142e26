"""Position information: attention alone is permutation-equivariant (§3.5).

* :class:`SinusoidalPositions` -- the paper's fixed encoding (§3.5):
  ``PE(pos, 2i) = sin(pos / 10000^(2i/d))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d))``.
  For any offset k, PE(pos + k) is a fixed linear map (a rotation of each (sin, cos) pair)
  of PE(pos) -- the property the paper cites for relative attention.
* :class:`LearnedPositions` -- a trained table (GPT-2, BERT).
* :class:`RotaryEmbedding` -- RoPE (Su et al., 2021): rotate each (x_i, x_{i+D/2}) pair of
  queries and keys by an angle proportional to the position, so q·k depends on the offset
  only.  ``scaling`` > 1 divides positions (linear position interpolation, Chen et al., 2023)
  to stretch a model to longer contexts.  Uses the "rotate half" layout of GPT-NeoX and HF
  Llama so that their weights load unchanged.

Positions are explicit integer tensors, (T,) or (B, T), so that left padding and KV-cache
offsets are handled by the caller passing the right numbers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def _check_positions(positions: Tensor, max_len: int) -> None:
    if positions.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"positions must be an integer tensor, got {positions.dtype}")
    if positions.numel() and int(positions.max()) >= max_len:
        raise ValueError(
            f"position {int(positions.max())} is beyond max_len={max_len}: the sequence is"
            f" longer than the model's positions support"
        )
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0, got {int(positions.min())}")


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


class SinusoidalPositions(nn.Module):
    """Fixed sinusoids added to the embeddings (§3.5).  No parameters."""

    table: Tensor

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("table", sinusoidal_table(max_len, d_model), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        """(T,) or (B, T) positions -> (T, D) or (B, T, D) encodings."""
        _check_positions(positions, self.max_len)
        return self.table[positions]


class LearnedPositions(nn.Module):
    """A trained (max_len, d_model) table (GPT-2, BERT)."""

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.zeros(max_len, d_model))

    def forward(self, positions: Tensor) -> Tensor:
        _check_positions(positions, self.max_len)
        return self.weight[positions]


class RotaryEmbedding(nn.Module):
    """RoPE angles for a head size ``dim``; :meth:`forward` gives (cos, sin) for positions."""

    cos_table: Tensor
    sin_table: Tensor

    def __init__(self, dim: int, max_len: int, base: float = 10000.0, scaling: float = 1.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"rotary head size must be even, got {dim}")
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
        _check_positions(positions, self.max_len)
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
