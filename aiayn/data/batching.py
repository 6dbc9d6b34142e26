"""Batching by token count (§5.1: "each training batch contained a set of sentence pairs
containing approximately 25000 source tokens and 25000 target tokens").

Sentences are sorted by length so that a batch holds sentences of similar length (little
compute spent on padding), then packed greedily: a batch may grow while
``n_sentences × longest_source <= max_tokens`` and the same on the target side -- the budget
counts padded tokens, so it bounds the real cost of the batch.  Batch order is shuffled with
a generator seeded by (seed, epoch), so an epoch's batches are reproducible from two integers,
which is what a resumed run needs.

Everything works on arrays of lengths, never on the tokens, so that a corpus of millions of
pairs (the paper's 4.5M of WMT14) is planned in a second from its shards' offsets index
(aiayn/data/shards.py): the sort is one ``argsort`` of a packed 64-bit key, and the packing
walks batch by batch, not sentence by sentence.  A ``BatchPlan`` holds an epoch as the
sorted order and the batches' bounds in it (a few bytes per pair), not as Python lists.

Shapes: N pairs, B sentences in a batch, S source length, T target length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from aiayn.errors import UserError

# (N, 2) source and target lengths, or the two as separate (N,) arrays
LengthsLike = Sequence[tuple[int, int]] | np.ndarray | tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class BatchPlan:
    """One epoch's batches: batch ``k`` is ``order[bounds[p] : bounds[p + 1]]`` with
    ``p = perm[k]`` (the shuffled batch order)."""

    order: np.ndarray  # (N,) int32 example indices, sorted by (source, target, tie)
    bounds: np.ndarray  # (n_batches + 1,) int64 starts of the batches in ``order``
    perm: np.ndarray  # (n_batches,) int64 the order the batches are drawn in

    def __len__(self) -> int:
        return len(self.perm)

    def __getitem__(self, k: int) -> np.ndarray:
        p = int(self.perm[k])
        return self.order[self.bounds[p] : self.bounds[p + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[k] for k in range(len(self)))

    def lists(self) -> list[list[int]]:
        return [b.tolist() for b in self]


def _as_arrays(lengths: LengthsLike) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths as two (N,) integer arrays (not copied when given so)."""
    if isinstance(lengths, tuple) and len(lengths) == 2 and isinstance(lengths[0], np.ndarray):
        return lengths[0], lengths[1]
    arr = np.asarray(lengths, dtype=np.int64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]


def _check(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> None:
    if max_tokens < 1:
        raise UserError(f"max_tokens={max_tokens} must be >= 1")
    too_long = np.flatnonzero(np.maximum(src, tgt) > max_tokens)
    if len(too_long):
        i = int(too_long[0])
        raise UserError(
            f"example {i} has {src[i]} source and {tgt[i]} target tokens, more than"
            f" max_tokens={max_tokens}"
        )


def _sorted_order(src: np.ndarray, tgt: np.ndarray, tie: np.ndarray | None) -> np.ndarray:
    """Indices sorted by (source length, target length, tie), equal keys in index order.

    The three keys pack into one uint64 -- 16 bits each for the lengths, the tie's float32
    bits below them (a non-negative float's bits order as the float does) -- so one stable
    argsort does what a Python ``sorted`` with a tuple key does, in a fraction of the memory.
    """
    if len(src) and max(int(src.max()), int(tgt.max())) >= 1 << 16:
        keys = [np.zeros(len(src), np.float32) if tie is None else tie, tgt, src]
        return np.lexsort(keys).astype(np.int64)  # rare: sentences of 65,536 tokens or more
    key = np.empty(len(src), dtype=np.uint64)
    step = 1 << 20  # built in slices: no full-size temporaries beside the key
    for i in range(0, len(src), step):
        part = key[i : i + step]
        part[:] = src[i : i + step]
        part <<= np.uint64(16)
        part |= tgt[i : i + step].astype(np.uint64)
        part <<= np.uint64(32)
        if tie is not None:
            part |= tie[i : i + step].view(np.uint32).astype(np.uint64)
    return np.argsort(key, kind="stable")


def _pack(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> np.ndarray:
    """Greedy packing of sorted lengths: the bounds of the batches.

    A batch starting at i takes the next k pairs while k × max(longest source, longest
    target) <= max_tokens.  That product only grows with k, so each batch is found by one
    vectorised look at a window of candidates (k <= max_tokens / src[i], since sources are
    sorted), not one Python step per sentence."""
    n = len(src)
    bounds = [0]
    i, guess = 0, 16
    while i < n:
        limit = min(n - i, max_tokens // max(int(src[i]), 1))
        width = min(limit, guess)
        while True:
            longest = np.maximum(src[i : i + width], np.maximum.accumulate(tgt[i : i + width]))
            fits = np.arange(1, width + 1) * longest <= max_tokens
            if not fits.all():
                size = int(np.argmin(fits))  # the first that does not fit
                break
            if width == limit:
                size = width
                break
            width = min(limit, 2 * width)
        size = max(size, 1)  # a pair alone always fits (checked)
        i += size
        bounds.append(i)
        guess = 2 * size + 16
    return np.asarray(bounds, dtype=np.int64)


def plan_batches(
    lengths: LengthsLike,
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> BatchPlan:
    """Examples grouped into batches whose padded size fits ``max_tokens`` per side.

    ``lengths`` is (N, 2): each example's source and target length.  Raises ValueError naming
    the example if one pair alone exceeds the budget.  The batches are those of
    ``token_batches``, exactly: the same sort, ties broken by the same draws of the
    generator seeded by (seed, epoch), the same shuffle."""
    src, tgt = _as_arrays(lengths)
    _check(src, tgt, max_tokens)
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    tie = torch.rand(len(src), generator=g).numpy() if shuffle else None
    order = _sorted_order(src, tgt, tie)
    del tie
    bounds = _pack(src[order], tgt[order], max_tokens)
    if len(order) < 1 << 31:
        order = order.astype(np.int32)  # half the memory of a plan over millions of pairs
    n_batches = len(bounds) - 1
    if shuffle:
        perm = torch.randperm(n_batches, generator=g).numpy().astype(np.int64)
    else:
        perm = np.arange(n_batches, dtype=np.int64)
    return BatchPlan(order, bounds, perm)


def token_batches(
    lengths: LengthsLike,
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[list[int]]:
    """``plan_batches`` as lists of indices (for small data and tests)."""
    return plan_batches(lengths, max_tokens, seed=seed, epoch=epoch, shuffle=shuffle).lists()


def batch_shapes(
    lengths: LengthsLike, max_tokens: int, *, seed: int, batches: int
) -> Iterator[tuple[int, int, int, int]]:
    """(sentences, padded source length, padded target length, real target tokens) of the
    first ``batches`` batches a run draws: ``plan_batches`` of each epoch in turn, the
    order the translation task trains on.  For counting a run's FLOPs and tokens without
    running it."""
    src, tgt = _as_arrays(lengths)
    drawn, epoch = 0, 0
    while drawn < batches:
        plan = plan_batches(np.stack([src, tgt], 1), max_tokens, seed=seed, epoch=epoch)
        if not len(plan):
            raise UserError("no batches: the data is empty")
        for b in plan:
            if drawn == batches:
                return
            yield len(b), int(src[b].max()), int(tgt[b].max()), int(tgt[b].sum())
            drawn += 1
        epoch += 1


def padding_fraction(lengths: LengthsLike, batches: BatchPlan | Sequence[Sequence[int]]) -> float:
    """Share of the padded source+target slots that are padding."""
    src, tgt = _as_arrays(lengths)
    real = padded = 0
    for batch in batches:
        b = np.asarray(batch, dtype=np.int64)
        s, t = src[b], tgt[b]
        real += int(s.sum()) + int(t.sum())
        padded += len(b) * (int(s.max()) + int(t.max()))
    return 1.0 - real / padded if padded else 0.0


def pad(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """(B, max length) long tensor, right-padded."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
