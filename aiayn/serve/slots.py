"""The KV cache as a pool of slots, for continuous batching.

A server decodes many sequences at once, and they start and finish at different steps.  The
pool preallocates keys and values for ``slots`` sequences of up to ``capacity`` tokens per
layer, one row per sequence, each row filled from position 0 (no padding inside a row).  A
request takes a free row when it starts and gives it back the moment it finishes, so memory
is never held by a finished request.

Two views of the pool feed the model's ordinary forward pass (nothing in the model knows it
is serving):

* ``SlotPool.row_cache`` -- one row as an ordinary ``Cache`` of batch
  1, for a request's prefill, chunk by chunk: the keys are written straight into the row.
* ``BatchCache`` -- the first ``n`` rows together, for one decoding step of every running
  request: each row appends its new token at its own length (rows differ), and a key mask
  hides each row's positions past its own length (no mask when the rows are of one length, a
  lone row included).  Attention is ragged: the rows are split into contiguous groups
  (``ragged_groups``) and each group reads the cache only up to its own longest row, so
  that a step costs what the rows hold, not n times the longest row.  The engine keeps the
  running rows in the order they started, which is nearly the order of their lengths, so that
  neighbours are alike (aiayn/serve/engine.py).

Running rows are kept at the front (rows 0 .. n-1), so a decoding step reads a view of the
pool, never a copy: when a request finishes, the running rows after it move up one
(``SlotPool.move``), keeping their start order.

Shapes: R rows (slots), H_kv key/value heads, S_max capacity, D head size, n running rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.errors import RequestError
from aiayn.models import DecoderLM
from aiayn.nn.cache import Cache, KVCache, LayerCache


def check_servable(model: DecoderLM) -> None:
    """The pool serves decoder-only models whose every layer keeps keys and values in full."""
    c = model.config
    if c.attention.sliding_window is not None:
        raise RequestError(
            f"attention.sliding_window={c.attention.sliding_window}: the serving pool keeps"
            " full rows; serve a model without a window, or use `aiayn generate`"
        )
    recurrent = [i for i in range(c.n_layers) if c.mixer_at(i) != "attention"]
    if recurrent:
        raise RequestError(
            f"mixer.kind={c.mixer.kind!r}: layers {recurrent} keep a recurrent state, which"
            " the serving pool does not hold yet; use `aiayn generate`"
        )


class SlotPool:
    """Keys and values for ``slots`` sequences of up to ``capacity`` tokens (module docstring)."""

    def __init__(self, model: DecoderLM, slots: int, capacity: int | None = None) -> None:
        check_servable(model)
        c = model.config
        capacity = c.max_len if capacity is None else capacity
        if slots < 1 or not 1 <= capacity <= c.max_len:
            raise RequestError(
                f"a pool needs slots >= 1 (got {slots}) and 1 <= capacity <= max_len={c.max_len}"
                f" (got {capacity})"
            )
        p = next(model.parameters())
        shape = (slots, c.kv_heads, capacity, c.head_dim)  # (R, H_kv, S_max, D)
        dtype = model.cache_dtype or p.dtype  # the KV cache's dtype (aiayn/models/precision.py)
        self.k = [torch.zeros(shape, dtype=dtype, device=p.device) for _ in range(c.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=p.device) for _ in range(c.n_layers)]
        self.lengths = torch.zeros(slots, dtype=torch.long, device=p.device)  # (R,) tokens held
        self.slots, self.capacity = slots, capacity

    def row_cache(self, row: int) -> Cache:
        """Row ``row`` as a batch-1 cache continuing at its length; appends land in the pool.
        Keep the returned object across a prefill's chunks (it remembers key positions)."""
        length = int(self.lengths[row])
        layers = [
            LayerCache(KVCache.over(k[row : row + 1], v[row : row + 1], length))
            for k, v in zip(self.k, self.v, strict=True)
        ]
        cache = Cache(layers)
        cache.seen = length
        return cache

    def batch_cache(self, n: int) -> BatchCache:
        """Rows 0 .. n-1 for one decoding step (one new token each)."""
        return BatchCache(self, n)

    def move(self, src: int, dst: int) -> None:
        """Copy row ``src`` (its filled positions) into row ``dst``."""
        length = int(self.lengths[src])
        for buf in (*self.k, *self.v):
            buf[dst, :, :length] = buf[src, :, :length]
        self.lengths[dst] = length

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))


class _RowsKV(KVCache):
    """One layer's keys and values of rows 0 .. n-1: each row appends at its own length."""

    def __init__(self, k: Tensor, v: Tensor, write: Tensor, read: int, even: bool) -> None:
        self.rolling, self.k, self.v, self.length = False, k, v, read - 1
        self.owns = False  # the pool's rows: a reorder selects into new buffers
        self.write, self.read = write, read  # (n,) positions to write; keys to return
        self.even = even  # every row writes at read - 1

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(n, H_kv, 1, D) new keys/values -> the (n, H_kv, S, D) rows to attend over."""
        k, v = k.to(self.k.dtype), v.to(self.v.dtype)  # a pool kept in another dtype (bf16)
        if self.even:  # one slice for all rows
            self.k[:, :, self.read - 1 : self.read] = k
            self.v[:, :, self.read - 1 : self.read] = v
        else:
            rows = torch.arange(k.shape[0], device=k.device)
            self.k[rows, :, self.write] = k[:, :, 0]
            self.v[rows, :, self.write] = v[:, :, 0]
        return self.k[:, :, : self.read], self.v[:, :, : self.read]


# One more attention call costs about what reading this many cached positions of one row does
# (PyTorch's fused kernel: a fixed cost per call, then a small one per row-position), and a
# group adds its slices and the concatenation (benchmarks/serve.py --in-process measures the
# effect; docs/performance.md, "The measurements behind the kernels").
GROUP_CALL_COST = 300


def ragged_groups(keys: list[int]) -> tuple[tuple[int, int, int], ...]:
    """Split rows 0 .. n-1 (in pool order, row i holding ``keys[i]`` keys) into contiguous
    groups ``(a, b, longest)`` that minimise the positions read -- each group reads its rows up
    to its longest -- plus ``GROUP_CALL_COST`` per group: dynamic programming over the
    split points, O(n²).  One group ``((0, n, max(keys)),)`` when that is best."""
    n = len(keys)
    best = [0.0] + [float("inf")] * n  # best[b]: the cheapest split of rows 0 .. b-1
    start = [0] * (n + 1)  # ... and where its last group starts
    for b in range(1, n + 1):
        longest = 0
        for a in range(b - 1, -1, -1):  # the last group a .. b-1, grown leftwards
            longest = max(longest, keys[a])
            cost = best[a] + (b - a) * longest + GROUP_CALL_COST
            if cost < best[b]:
                best[b], start[b] = cost, a
    groups, b = [], n
    while b:
        a = start[b]
        groups.append((a, b, max(keys[a:b])))
        b = a
    return tuple(reversed(groups))


class BatchCache(Cache):
    """Rows 0 .. n-1 of a ``SlotPool`` as the cache of one decoding step: the model's
    forward pass on (n, 1) ids appends each row's token at that row's length, and every row
    attends to its own positions only (a key mask over the longest row's length)."""

    def __init__(self, pool: SlotPool, n: int) -> None:
        if not 1 <= n <= pool.slots:
            raise RequestError(f"{n} running rows: the pool has {pool.slots}")
        self.pool, self.n = pool, n
        self.write = pool.lengths[:n].clone()  # (n,) where each row's new token goes
        longest = int(self.write.max())
        if longest >= pool.capacity:
            raise RequestError(f"a row is full: {longest} tokens in a pool of {pool.capacity}")
        read = longest + 1
        self.even = bool((self.write == longest).all())  # rows of one length: no key mask
        super().__init__(
            [
                LayerCache(_RowsKV(k[:n], v[:n], self.write, read, self.even))
                for k, v in zip(pool.k, pool.v, strict=True)
            ]
        )
        self.read = read
        self.seen = longest  # the model checks seen + 1 <= max_len
        self._groups = None if self.even else ragged_groups((self.write + 1).tolist())

    @property
    def row_groups(self) -> tuple[tuple[int, int, int], ...] | None:
        """Contiguous groups of rows whose attention reads only up to the group's longest row
        (``ragged_groups``); None when the rows are of one length (no key mask)."""
        return self._groups

    def advance(
        self, t: int, keep: Tensor | None, device: torch.device
    ) -> tuple[Tensor | None, Tensor, Tensor]:
        """Positions and key mask of the step: row i's token sits at position write[i] and
        sees keys 0 .. write[i]."""
        if t != 1 or keep is not None:
            raise RequestError("a batch of pool rows decodes one real token per row and step")
        keys = torch.arange(self.read, device=device)  # (S,)
        key_mask = None if self.even else keys[None] <= self.write[:, None]  # (n, S)
        self.pool.lengths[: self.n] += 1
        self.seen += 1
        return key_mask, self.write[:, None], keys[None]
