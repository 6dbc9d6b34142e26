"""How a model knows where its tokens are (§3.5), as one small interface.

Attention alone is permutation-equivariant: shuffle the tokens and the outputs shuffle with
them.  A position scheme breaks that symmetry at one of three places, and implements only the
hooks it needs:

* ``PositionScheme.embed`` -- a vector added to each token's embedding (the paper's
  sinusoids, a learned table);
* ``PositionState.on_qk`` -- a transformation of queries and keys inside self-attention
  (rotary positions);
* ``PositionState.score_bias`` -- an additive bias on the attention scores (ALiBi).

The model asks its scheme once per forward pass for a ``PositionState``, given the
positions of the new (query) tokens and of every key they attend to -- with a KV cache, the
keys include the cached positions.  A scheme is registered by name in aiayn/registry.py.

This base class is the scheme ``"none"``: no position information at all.

Positions are explicit integer tensors, (T,) or (B, T) -- (B, T) when left padding makes them
differ per row -- so that padding and cache offsets are the caller's numbers, not guesses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig, PositionConfig
from aiayn.errors import UserError


def check_positions(positions: Tensor, max_len: int) -> None:
    """Positions must be integers in [0, max_len)."""
    if positions.dtype not in (torch.int64, torch.int32):
        raise UserError(f"positions must be an integer tensor, got {positions.dtype}")
    if not positions.numel() or torch.compiler.is_compiling():
        return  # a captured step's positions come from its static cache, checked on reserve
    low, high = (int(v) for v in torch.aminmax(positions))  # one pass, one sync
    if high >= max_len:
        raise UserError(
            f"position {high} is beyond max_len={max_len}: the sequence is"
            f" longer than the model's positions support"
        )
    if low < 0:
        raise UserError(f"positions must be >= 0, got {low}")


class PositionState:
    """A scheme's contribution to self-attention in one forward pass (this one: none)."""

    def on_qk(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """(B, H, T, D) queries and (B, H_kv, T, D) new keys -> transformed."""
        return q, k

    def score_bias(self) -> Tensor | None:
        """An additive bias broadcastable to the (B, H, T, S) scores, or None."""
        return None


NO_POSITIONS = PositionState()


@dataclass(frozen=True)
class PositionSizes:
    """The sizes of the model a scheme serves: positions below ``max_len``; vectors of
    ``d_model`` added to the embeddings (sinusoidal, learned), or ``n_heads`` heads of
    ``head_dim`` inside attention (ALiBi's slopes, RoPE's rotations)."""

    max_len: int
    d_model: int
    n_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: ModelConfig) -> PositionSizes:
        return cls(config.max_len, config.d_model, config.attention.n_heads, config.head_dim)


class PositionScheme(nn.Module):
    """The ``"none"`` scheme, and the interface every scheme implements: built from the
    model's ``PositionConfig`` and its ``PositionSizes``."""

    def __init__(self, positions: PositionConfig, sizes: PositionSizes) -> None:
        super().__init__()
        self.max_len = sizes.max_len

    def embed(self, positions: Tensor) -> Tensor | None:
        """(T,) or (B, T) positions -> (T, C) or (B, T, C) added to the embeddings, or None."""
        return None

    def state(self, q_positions: Tensor, k_positions: Tensor) -> PositionState:
        """What self-attention needs for queries at ``q_positions`` (T,) or (B, T) facing keys
        at ``k_positions`` (S,) or (B, S)."""
        return NO_POSITIONS
