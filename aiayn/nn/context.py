"""What one forward pass through a stack of blocks needs besides its input, in one object.

A block asks three questions of its context: what may attend to what (the mask, causality,
the sliding window, the encoder output and its padding for cross-attention), where the tokens
are (the position scheme's state for this pass), and where keys and values are kept between
passes (the KV cache).  The model builds the context once per forward pass; every block reads
it; nothing is rebuilt per layer.

A ``Record`` is the one way to get intermediates out of a pass: attention weights (the
reference backend's), raw scores ``q k^T / sqrt(d_k)`` for every query-key pair (masked pairs
included, for "what if" views), and mixture-of-experts router statistics.  The pictures, the
explorer and the trainer all read it.

Shapes: B batch, T queries, S keys, S_src encoder positions, C = d_model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from aiayn.nn.cache import Cache
from aiayn.nn.moe import RouterStats
from aiayn.nn.positions.base import NO_POSITIONS, PositionState
from aiayn.nn.static_cache import StaticCache


@dataclass
class AttentionRecord:
    """One attention module's part of a pass.  ``stream`` is "self" (decoder-only or
    encoder-only), "encoder", "decoder" (masked self-attention of an encoder-decoder) or
    "cross"; ``layer`` counts from 0 within the stream."""

    stream: str
    layer: int
    weights: Tensor | None  # (B, H, T, S) the weights used, when Record.weights
    scores: Tensor | None  # (B, H, T, S) q·k / sqrt(d_k), no mask, when Record.scores
    causal: bool  # the module applied the causal mask
    window: int | None  # ... and this sliding window


@dataclass
class Record:
    """Opt-in intermediates of one forward pass (see the module docstring)."""

    weights: bool = False  # keep every attention module's weights (uses the reference backend)
    scores: bool = False  # keep every attention module's raw scores
    attention: list[AttentionRecord] = field(default_factory=list)
    router: list[RouterStats] = field(default_factory=list)  # always kept: they are small

    @property
    def wants_attention(self) -> bool:
        return self.weights or self.scores

    def stream(self, name: str) -> list[AttentionRecord]:
        return [a for a in self.attention if a.stream == name]


@dataclass
class Context:
    """The forward context of one stack (see the module docstring)."""

    mask: Tensor | None = None  # (B, 1, 1|T, S) bool, True = may attend (self-attention)
    causal: bool = False
    window: int | None = None  # causal sliding window
    positions: PositionState = NO_POSITIONS
    cache: Cache | StaticCache | None = None
    memory: Tensor | None = None  # (B, S_src, C) encoder output, for cross-attention
    memory_mask: Tensor | None = None  # (B, 1, 1, S_src) bool
    record: Record | None = None

    def new_token_keep(self, t: int) -> Tensor | None:
        """(B, T) True at the real tokens among the ``t`` this pass adds (the last t keys of
        the mask), or None when every token is real: what a recurrent layer keeps out of its
        state."""
        return None if self.mask is None else self.mask[:, 0, 0, -t:]
