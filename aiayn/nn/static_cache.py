"""A static KV cache: every shape fixed when it is made, every position a tensor.

``Cache`` grows: a step reads the first ``length`` slots, and ``length``
is a Python number that changes at every step.  That is right for eager decoding, where each
step attends over exactly the tokens it has, but a compiled step would meet a new shape (and
compile again) at every token.  The static cache keeps what changes in tensors instead, as
gpt-fast does on GPUs, so that one decoding step is the same function of the same shapes from
the first token to the last, and can be captured once per batch size (aiayn/generate/captured.py):

* keys and values: (B, H_kv, S_max, D) per layer, allocated once; a step writes its T new
  positions in place at the slots ``slot .. slot + T - 1`` (``index_copy_``), and attention
  reads all S_max slots;
* ``key_mask`` (B, S_max): True at the slots that hold a real token.  Slots not yet written,
  and left padding, are False, so attention over all S_max slots gives exactly the result of
  attention over the filled ones (a masked key has weight exp(-inf) = 0);
* ``slot`` (1,): the next slot, shared by every row (a left-padded batch fills its columns
  together); ``real`` (B,): each row's real tokens so far, which is its next position;
  ``key_positions`` (B, S_max): the position of the token in each slot.

A step of T > 1 tokens (the prompt) also gets the causal rule as a mask: query i, written at
slot ``slot + i``, sees the slots up to its own.

The Python-side count of filled slots (``length``) is kept by ``reserve``, which the
decoding loop calls before each forward pass, outside any captured function: it is the one
check that the cache has room, with a clear error.  Inside the pass nothing reads a Python
number that changes from step to step.

``reorder`` (beam search) gathers every layer's rows by a parent index in place, copying
only the rows whose parent is another row (aiayn/nn/cache.py, ``reorder_rows_``).  Rolling
windows and recurrent layers are left to the growing cache; ``supports`` says whether a model
can use this one.

Shapes: B batch, H_kv key/value heads, S_max slots, D head size, T new positions.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import UserError
from aiayn.nn.cache import moved_rows, reorder_rows_, scratch_for


class StaticKV:
    """One layer's keys and values, (B, H_kv, S_max, D) each, written at the cache's slots."""

    def __init__(self, owner: StaticCache, k: Tensor, v: Tensor) -> None:
        self.owner, self.k, self.v = owner, k, v

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write (B, H_kv, T, D) keys and values at this step's slots; return all S_max."""
        slots = self.owner.step_slots  # (T,)
        self.k.index_copy_(2, slots, k.to(self.k.dtype))
        self.v.index_copy_(2, slots, v.to(self.v.dtype))
        return self.k, self.v

    def reorder(self, moves: tuple[Tensor, Tensor], filled: int, scratch: Tensor) -> None:
        """Rows ``index`` in place (``moves`` = ``moved_rows(index)``), writing only the rows
        that change and only the first ``filled`` slots (the rest are masked until they are
        written)."""
        for buf in (self.k, self.v):
            reorder_rows_(buf, moves, self.k.shape[0], filled, scratch)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


class StaticLayer:
    """A layer's part of the cache: its self-attention keys and values, and (for an
    encoder-decoder) the cross-attention keys and values computed on the first step."""

    def __init__(self, self_kv: StaticKV) -> None:
        self.self_kv = self_kv
        self.cross_kv: tuple[Tensor, Tensor] | None = None
        self.state: Any = None


class StaticCache:
    """The whole decoder's static cache (see the module docstring)."""

    static = True
    row_groups = None  # every row reads every slot (the mask hides what it may not see)

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        capacity: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if batch < 1 or capacity < 1:
            raise UserError(
                f"a static cache needs batch >= 1 and capacity >= 1, got {batch}, {capacity}"
            )
        shape = (batch, n_kv_heads, capacity, head_dim)  # (B, H_kv, S_max, D)
        self.layers = [
            StaticLayer(
                StaticKV(
                    self,
                    torch.zeros(shape, dtype=dtype, device=device),
                    torch.zeros(shape, dtype=dtype, device=device),
                )
            )
            for _ in range(n_layers)
        ]
        self.batch, self.slots = batch, capacity
        self.key_mask = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        self.key_positions = torch.zeros(batch, capacity, dtype=torch.long, device=device)
        self.real = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) next positions
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # next slot, every row
        self.step_slots = self.slot  # (T,) the slots of the pass under way
        self.memory_mask: Tensor | None = None
        self.length = 0  # slots reserved so far (Python-side, see reserve())
        self.scratch: Tensor | None = None  # made on the first reorder

    @property
    def capacity(self) -> int:
        return self.slots

    def reserve(self, t: int) -> None:
        """Claim ``t`` more slots before a forward pass of ``t`` tokens per row; the one place
        that checks for room (a captured step reads no changing Python number)."""
        if self.length + t > self.slots:
            raise UserError(
                f"static KV cache is full: {self.length} cached + {t} new positions exceed its"
                f" capacity of {self.slots}"
            )
        self.length += t

    def check_room(self, t: int, max_len: int) -> None:
        """Nothing to check here: ``reserve`` did, and the capacity is at most max_len."""

    def advance(
        self, t: int, keep: Tensor | None, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Account for the next T positions before the layers write their keys: the key mask
        over all slots -- (B, S_max) for one token, (B, T, S_max) with the causal rule for
        several --, the (B, T) positions of the new tokens, and the (B, S_max) positions of
        every slot."""
        b = self.batch
        slots = self.slot + torch.arange(t, device=device)  # (T,)
        if keep is None:
            keep = torch.ones(b, t, dtype=torch.bool, device=device)
        positions = (self.real[:, None] + keep.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        self.real.add_(keep.long().sum(-1))
        self.key_mask.index_copy_(1, slots, keep)
        self.key_positions.index_copy_(1, slots, positions)
        self.slot.add_(t)
        self.step_slots = slots
        if t == 1:
            return self.key_mask, positions, self.key_positions
        seen = torch.arange(self.slots, device=device)[None, :] <= slots[:, None]  # (T, S_max)
        return self.key_mask[:, None, :] & seen, positions, self.key_positions

    def pad_memory(self, multiple: int) -> None:
        """Pad the cross-attention keys and values (after the first step computed them) and the
        source mask to a multiple of ``multiple`` source positions, the padding masked: then
        sources of nearby lengths share one captured step."""
        if self.memory_mask is None:
            return
        s = self.memory_mask.shape[1]
        extra = -s % multiple
        if not extra:
            return
        for layer in self.layers:
            if layer.cross_kv is not None:
                k, v = layer.cross_kv  # (B', H_kv, S, D)
                layer.cross_kv = (F.pad(k, (0, 0, 0, extra)), F.pad(v, (0, 0, 0, extra)))
        self.memory_mask = F.pad(self.memory_mask, (0, extra), value=False)  # (B', S + extra)

    def reorder(self, index: Tensor, memory_index: Tensor | None = None) -> None:
        """Keep rows ``index`` (B,) in place: beam search's surviving parents.  The batch size
        stays; cross-attention keys and values, one per group of beams, stay as they are."""
        if index.shape[0] != self.batch or memory_index is not None:
            raise UserError("a static cache keeps its batch size: reorder by a full (B,) index")
        moves = moved_rows(index)
        self.scratch = scratch_for(self.scratch, self.layers[0].self_kv.k)  # for every layer
        for layer in self.layers:
            layer.self_kv.reorder(moves, self.length, self.scratch)
        self.key_mask.copy_(self.key_mask.index_select(0, index))
        self.key_positions.copy_(self.key_positions.index_select(0, index))
        self.real.copy_(self.real.index_select(0, index))

    def nbytes(self) -> int:
        return sum(layer.self_kv.nbytes() for layer in self.layers)


MIN_SLOTS = 64


def capacity_for(length: int, max_len: int) -> int:
    """A static cache's slots for ``length`` positions: the next power of two from MIN_SLOTS,
    at most ``max_len``.  Every length then falls in one of a few sizes (5 up to 1,024), so a
    model meets few shapes -- each a capture -- while no step reads more than twice the slots
    it needs."""
    slots = MIN_SLOTS
    while slots < length:
        slots *= 2
    return min(slots, max_len)


def supports(model: nn.Module) -> str | None:
    """None when ``model`` can decode with a static cache, else why not (a rolling window or a
    recurrent layer keeps state this cache does not)."""
    config = getattr(model, "config", None)
    layers: int = getattr(model, "cache_layers", 0)
    if config is None or not layers:
        return "the model has no KV cache"
    if config.attention.sliding_window is not None:
        return "a sliding window needs the rolling cache"
    if any(config.mixer_at(i) != "attention" for i in range(layers)):
        return "a recurrent layer keeps a state of its own"
    return None
