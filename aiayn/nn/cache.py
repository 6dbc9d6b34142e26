"""The key/value cache for autoregressive decoding, as an explicit object.

At decoding step t the decoder's self-attention needs the keys and values of all earlier
positions; recomputing them costs O(t) work per layer per step.  The cache keeps them: each
step appends one position and attends over the stored prefix.  Cross-attention keys and values
depend only on the encoder output, so they are computed once per sentence.

Memory per token and layer: 2 · n_kv_heads · d_head · bytes -- grouped-query attention shrinks
it by n_heads / n_kv_heads.

The buffers are preallocated to ``capacity`` positions so that appending never reallocates;
:meth:`Cache.reorder` selects batch rows (beam search).

Shapes: B batch, H_kv key/value heads, S cached positions, D head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


class KVCache:
    """One self-attention layer's keys and values, preallocated to ``capacity`` positions."""

    def __init__(
        self,
        batch: int,
        n_kv_heads: int,
        capacity: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        shape = (batch, n_kv_heads, capacity, head_dim)  # (B, H_kv, S_max, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, H_kv, T, D) keys/values; return views of all (B, H_kv, S, D) so far."""
        t = k.shape[2]
        if self.length + t > self.capacity:
            raise ValueError(
                f"KV cache is full: {self.length} cached + {t} new positions exceed its"
                f" capacity of {self.capacity}"
            )
        end = self.length + t
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (B',), e.g. the surviving beams' parents."""
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


@dataclass
class LayerCache:
    """Per decoder layer: its growing self-attention cache, and cross-attention K/V once."""

    self_kv: KVCache
    cross_kv: tuple[Tensor, Tensor] | None = None

    def reorder(self, index: Tensor) -> None:
        self.self_kv.reorder(index)
        if self.cross_kv is not None:
            k, v = self.cross_kv
            self.cross_kv = (k.index_select(0, index), v.index_select(0, index))


@dataclass
class Cache:
    """The whole decoder's cache: one :class:`LayerCache` per layer, plus the key mask.

    ``key_mask`` (B, S) records which cached positions are real tokens (False for left
    padding), so later steps keep ignoring them.
    """

    layers: list[LayerCache]
    key_mask: Tensor | None = None
    memory_mask: Tensor | None = None  # (B, S_src) source padding, for cross-attention

    @classmethod
    def empty(
        cls,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        capacity: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> Cache:
        return cls(
            [
                LayerCache(
                    KVCache(batch, n_kv_heads, capacity, head_dim, dtype=dtype, device=device)
                )
                for _ in range(n_layers)
            ]
        )

    @property
    def length(self) -> int:
        return self.layers[0].self_kv.length

    @property
    def capacity(self) -> int:
        return self.layers[0].self_kv.capacity

    def reorder(self, index: Tensor) -> None:
        for layer in self.layers:
            layer.reorder(index)
        if self.key_mask is not None:
            self.key_mask = self.key_mask.index_select(0, index)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, index)

    def nbytes(self) -> int:
        return sum(layer.self_kv.nbytes() for layer in self.layers)
