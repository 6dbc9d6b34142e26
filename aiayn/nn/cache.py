"""The key/value cache for autoregressive decoding, as an explicit object.

At decoding step t the decoder's self-attention needs the keys and values of all earlier
positions; recomputing them costs O(t) work per layer per step.  The cache keeps them: each
step appends one position and attends over the stored prefix.  Cross-attention keys and values
depend only on the encoder output, so they are computed once per sentence.

Memory per token and layer: 2 · n_kv_heads · d_head · bytes -- grouped-query attention shrinks
it by n_heads / n_kv_heads.

Two layouts share one append routine (``_append``):

* growing -- preallocated to ``capacity`` positions, so appending never reallocates;
* rolling -- for sliding-window attention (Mistral, Jiang et al., 2023): a ring of ``window``
  slots; position p is stored in slot p mod window, overwriting the position that has just
  left the window, so memory stays bounded by the window however long generation runs.
  Attention does not care about the order of its keys (RoPE and absolute positions are
  already in the vectors), so a one-token step reads the ring as it is; a multi-token step
  reads the kept positions in time order followed by the new ones, and the window mask
  (aligned bottom-right) does the rest.

``Cache.reorder`` selects batch rows (beam search) in place, rewriting only the rows whose
parent is another row: most hypotheses extend their own.

Shapes: B batch, H_kv key/value heads, S cached positions, D head size, W window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import UserError


def _append(buf: Tensor, seen: int, new: Tensor, rolling: bool) -> tuple[Tensor, Tensor]:
    """Write ``new`` (positions seen..seen+T-1 along dim 2) into ``buf``; return (updated
    buffer, what attention should read).  ``buf`` is (B, H, N, D) or (B, N) -- dim 2 or 1."""
    dim = 2 if buf.dim() == 4 else 1
    t, n = new.shape[dim], buf.shape[dim]
    if not rolling:
        if seen + t > n:
            raise UserError(
                f"KV cache is full: {seen} cached + {t} new positions exceed its capacity of {n}"
            )
        buf.narrow(dim, seen, t).copy_(new)
        return buf, buf.narrow(dim, 0, seen + t)
    if t == 1:  # the common decoding step: overwrite the slot leaving the window
        buf.narrow(dim, seen % n, 1).copy_(new)
        return buf, buf.narrow(dim, 0, min(seen + 1, n))
    kept = min(seen, n)
    order = torch.arange(seen - kept, seen, device=buf.device) % n  # kept slots, oldest first
    read = torch.cat([buf.index_select(dim, order), new], dim)
    last = min(t, n)  # only the newest `window` positions are stored
    slots = torch.arange(seen + t - last, seen + t, device=buf.device) % n
    buf.index_copy_(dim, slots, new.narrow(dim, t - last, last))
    return buf, read


def _select_rows(buf: Tensor, index: Tensor, length: int) -> Tensor:
    """(B, H, N, D) buffer -> a new (B', H, N, D) one with rows ``index``, copying only the first
    ``length`` slots when fewer are filled (the rest are left unset)."""
    n = min(length, buf.shape[2])
    if n == buf.shape[2]:
        return buf.index_select(0, index)
    out = buf.new_empty((index.shape[0], *buf.shape[1:]))
    torch.index_select(buf.narrow(2, 0, n), 0, index, out=out.narrow(2, 0, n))
    return out


def moved_rows(index: Tensor) -> tuple[Tensor, Tensor]:
    """The rows that a reorder by ``index`` (B',) must write -- those that do not already hold
    their parent, ``index[r] != r`` -- and their parents: (M,) each."""
    rows = torch.arange(index.shape[0], device=index.device)
    dest = (index != rows).nonzero().squeeze(1)
    return dest, index[dest]


def scratch_for(scratch: Tensor | None, like: Tensor) -> Tensor:
    """A 1-D buffer that holds a copy of ``like``: ``scratch`` when it can, else a new one."""
    if scratch is None or scratch.numel() < like.numel() or scratch.dtype != like.dtype:
        return like.new_empty(like.numel())
    return scratch


def reorder_rows_(
    buf: Tensor,
    moves: tuple[Tensor, Tensor],
    rows: int,
    length: int,
    scratch: Tensor | None = None,
) -> Tensor:
    """Rows ``index`` of a (B, H, N, D) buffer, in place, as its leading ``rows`` <= B rows;
    ``moves`` = ``moved_rows(index)``.  Only the rows that change are written, each from a
    copy of its parent taken before any is written (so a row may be both a parent and
    rewritten), and only the first ``length`` slots.  In beam search most hypotheses extend
    their own row, so this copies a fraction of what gathering every row would.  ``scratch``
    (1-D, at least buf's size) holds the copies; without it they are allocated."""
    dest, src = moves
    part = buf.narrow(2, 0, min(length, buf.shape[2]))
    if dest.numel():
        shape = (src.shape[0], *part.shape[1:])
        need = math.prod(shape)
        tmp = buf.new_empty(shape) if scratch is None else scratch[:need].view(shape)
        torch.index_select(part, 0, src, out=tmp)
        part.index_copy_(0, dest, tmp)
    return buf[:rows]


def _follow(x: Tensor, rows: int, index: Tensor, memory_index: Tensor | None) -> Tensor:
    """A tensor of the source side, reordered with ``rows`` batch rows by ``index``: as the
    rows when it has one per row, else (one per group of rows) by ``memory_index`` or not."""
    if x.shape[0] == rows:
        return x.index_select(0, index)
    return x if memory_index is None else x.index_select(0, memory_index)


class KVCache:
    """One self-attention layer's keys and values: growing (``capacity`` slots) or rolling
    (``window`` slots)."""

    def __init__(
        self,
        batch: int,
        n_kv_heads: int,
        capacity: int,
        head_dim: int,
        *,
        window: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.rolling = window is not None
        slots = min(capacity, window) if window is not None else capacity
        shape = (batch, n_kv_heads, slots, head_dim)  # (B, H_kv, S_max, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # positions seen so far (may exceed the slots when rolling)
        # Reorders rewrite these buffers' rows in place (``reorder_rows_``); a cache over a
        # serving pool's rows (``over``) does not own them, and selects into new buffers.
        self.owns = True

    @classmethod
    def over(cls, k: Tensor, v: Tensor, length: int) -> KVCache:
        """A growing cache over existing (B, H_kv, S_max, D) buffers whose first ``length``
        positions are filled; appends write into those buffers (a serving pool's rows:
        aiayn/serve/slots.py)."""
        cache = cls.__new__(cls)
        cache.rolling, cache.k, cache.v, cache.length = False, k, v, length
        cache.owns = False
        return cache

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append (B, H_kv, T, D) keys/values; return the (B, H_kv, S, D) keys/values to attend."""
        self.k, k_all = _append(self.k, self.length, k, self.rolling)
        self.v, v_all = _append(self.v, self.length, v, self.rolling)
        self.length += k.shape[2]
        return k_all, v_all

    def reorder(
        self,
        index: Tensor,
        moves: tuple[Tensor, Tensor] | None = None,
        scratch: Tensor | None = None,
    ) -> None:
        """Keep batch rows ``index`` (B',), e.g. the surviving beams' parents.  Only the filled
        slots are copied: the rest are never read before they are written.  Up to its own
        batch size, a cache that owns its buffers rewrites only the rows that change, in
        place (``reorder_rows_``; ``moves`` and ``scratch`` as there)."""
        rows = index.shape[0]
        if not self.owns or rows > self.k.shape[0]:
            self.k = _select_rows(self.k, index, self.length)
            self.v = _select_rows(self.v, index, self.length)
            return
        moves = moved_rows(index) if moves is None else moves
        self.k = reorder_rows_(self.k, moves, rows, self.length, scratch)
        self.v = reorder_rows_(self.v, moves, rows, self.length, scratch)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


@dataclass
class LayerCache:
    """Per decoder layer: its self-attention cache, cross-attention K/V computed once, and
    the fixed-size state of a recurrent layer (linear attention: aiayn/nn/linear_attention.py),
    whose key/value cache then has no slots."""

    self_kv: KVCache
    cross_kv: tuple[Tensor, Tensor] | None = None
    state: Any = None  # has .reorder(index) and .nbytes()

    def reorder(
        self,
        index: Tensor,
        memory_index: Tensor | None = None,
        moves: tuple[Tensor, Tensor] | None = None,
        scratch: Tensor | None = None,
    ) -> None:
        """Keep rows ``index``; cross-attention keys/values as ``Cache.reorder`` says."""
        rows = self.self_kv.k.shape[0]
        self.self_kv.reorder(index, moves, scratch)
        if self.cross_kv is not None:
            k, v = self.cross_kv
            self.cross_kv = (
                _follow(k, rows, index, memory_index),
                _follow(v, rows, index, memory_index),
            )
        if self.state is not None:
            self.state.reorder(index)

    def nbytes(self) -> int:
        return self.self_kv.nbytes() + (0 if self.state is None else self.state.nbytes())


class Cache:
    """The whole decoder's cache: one ``LayerCache`` per layer, and the key mask.

    The key mask records which cached positions are real tokens (False for left padding), in
    the same slots as the keys, so later steps keep ignoring padding; ``real`` counts each
    row's real tokens, which is the next position of that row.
    """

    def __init__(self, layers: list[LayerCache]) -> None:
        self.layers = layers
        self.seen = 0  # positions seen so far
        # The layers that keep keys (a recurrent layer keeps none): their slots and layout.  When
        # none does, the key mask and positions keep the newest position only (a ring of one),
        # so that the cache stays the same size however long decoding runs.
        keeping = [layer.self_kv for layer in layers if layer.self_kv.capacity]
        if keeping:
            self.slots, self.rolling = keeping[0].capacity, keeping[0].rolling
        else:
            self.slots, self.rolling = 1, True
        self.key_mask: Tensor | None = None  # (B, slots), allocated on first padded input
        self.real: Tensor | None = None  # (B,) real tokens so far, with key_mask
        self.memory_mask: Tensor | None = None  # (B, S_src) source padding, for cross-attention
        self.positions: Tensor | None = None  # (B|1, slots) the position of each cached key
        self.scratch: Tensor | None = None  # what reorders copy moving rows through

    @classmethod
    def empty(
        cls,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        capacity: int,
        head_dim: int,
        *,
        window: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        recurrent: Sequence[int] = (),
    ) -> Cache:
        """``recurrent`` layers keep a state of their own instead of keys and values."""
        layers = [
            LayerCache(
                KVCache(
                    batch,
                    n_kv_heads,
                    0 if i in recurrent else capacity,
                    head_dim,
                    window=window,
                    dtype=dtype,
                    device=device,
                )
            )
            for i in range(n_layers)
        ]
        return cls(layers)

    static = False  # grows: see aiayn/nn/static_cache.py for the other kind

    @property
    def length(self) -> int:
        """Positions seen so far."""
        return self.seen

    def check_room(self, t: int, max_len: int) -> None:
        """Refuse a pass of ``t`` more positions that would take the sequence past ``max_len``."""
        if self.seen + t > max_len:
            raise UserError(
                f"sequence of length {self.seen + t} exceeds the model's max_len={max_len}"
            )

    @property
    def capacity(self) -> int:
        """Slots per layer that keeps keys: the window when rolling."""
        return self.slots

    def append_key_mask(self, keep: Tensor) -> tuple[Tensor, Tensor]:
        """Record (B, T) real-token flags for the next T positions.

        Returns the (B, S) key mask in the order the layers will return keys, and the (B, T)
        positions of the new tokens counted over real tokens only.
        """
        b = keep.shape[0]
        if self.key_mask is None:  # everything cached so far was real
            self.key_mask = torch.ones(b, self.capacity, dtype=torch.bool, device=keep.device)
            self.real = torch.full((b,), self.length, dtype=torch.long, device=keep.device)
        assert self.real is not None
        self.key_mask, read = _append(self.key_mask, self.length, keep, self.rolling)
        positions = self.real[:, None] + keep.long().cumsum(-1) - 1  # (B, T)
        self.real = self.real + keep.long().sum(-1)
        return read, positions.clamp(min=0)

    @property
    def row_groups(self) -> tuple[tuple[int, int, int], ...] | None:
        """Groups of rows that read only their own keys in this step (a serving pool's ragged
        rows, aiayn/serve/slots.py); None: every row reads every key."""
        return None

    def advance(
        self, t: int, keep: Tensor | None, device: torch.device
    ) -> tuple[Tensor | None, Tensor, Tensor]:
        """Account for the next T positions before the layers append their keys.

        ``keep`` (B, T) flags real tokens (False for left padding), or None when all are real.
        Returns the (B, S) key mask (None while every cached token is real), the positions of
        the T new tokens -- (T,), or (B, T) once padding makes rows differ -- and the positions
        of all S keys the layers will return, (1|B, S), in the same order as the keys.
        """
        seen = self.length
        if keep is None and self.key_mask is None:
            key_mask = None
            positions = torch.arange(seen, seen + t, device=device)  # (T,)
        else:
            if keep is None:
                assert self.key_mask is not None
                keep = torch.ones(self.key_mask.shape[0], t, dtype=torch.bool, device=device)
            key_mask, positions = self.append_key_mask(keep)  # positions: (B, T)
        rows = positions if positions.dim() == 2 else positions[None]  # (B|1, T)
        if self.positions is None:
            self.positions = torch.zeros(
                rows.shape[0], self.capacity, dtype=torch.long, device=device
            )
        elif self.positions.shape[0] != rows.shape[0]:  # padding arrived: one row per sequence
            self.positions = self.positions.expand(rows.shape[0], -1).clone()
        self.positions, key_positions = _append(self.positions, seen, rows, self.rolling)
        self.seen += t
        return key_mask, positions, key_positions

    def reorder(self, index: Tensor, memory_index: Tensor | None = None) -> None:
        """Keep batch rows ``index`` (B',): beam search's surviving parents.

        What belongs to the source sentence -- cross-attention keys and values, the source
        mask -- follows ``index`` when it has one row per batch row.  When it has one row per
        group of rows (beam search keeps one per sentence for its K beams), it stays as it is,
        or keeps the rows ``memory_index`` when given (sentences that have finished leave).
        """
        rows = self.layers[0].self_kv.k.shape[0] if self.layers else index.shape[0]
        moves, scratch = moved_rows(index), self._scratch()
        for layer in self.layers:
            layer.reorder(index, memory_index, moves, scratch)
        if self.positions is not None and self.positions.shape[0] > 1:
            self.positions = self.positions.index_select(0, index)
        if self.key_mask is not None and self.real is not None:
            self.key_mask = self.key_mask.index_select(0, index)
            self.real = self.real.index_select(0, index)
        if self.memory_mask is not None:
            self.memory_mask = _follow(self.memory_mask, rows, index, memory_index)

    def _scratch(self) -> Tensor | None:
        """One buffer, as large as a layer's keys, that every layer's reorder copies its
        moving rows through (made on the first reorder)."""
        kv = [layer.self_kv.k for layer in self.layers if layer.self_kv.capacity]
        if not kv:
            return None
        self.scratch = scratch_for(self.scratch, max(kv, key=Tensor.numel))
        return self.scratch

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.layers)
