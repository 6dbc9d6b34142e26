"""Batching by token count (§5.1: "each training batch contained a set of sentence pairs
containing approximately 25000 source tokens and 25000 target tokens").

Sentences are sorted by length so that a batch holds sentences of similar length (little
compute spent on padding), then packed greedily: a batch may grow while
``n_sentences × longest_source <= max_tokens`` and the same on the target side -- the budget
counts padded tokens, so it bounds the real cost of the batch.  Batch order is shuffled with
a generator seeded by (seed, epoch), so an epoch's batches are reproducible from two integers,
which is what a resumed run needs.

Shapes: B sentences, S source length, T target length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor


def batch_shapes(
    lengths: Sequence[tuple[int, int]], max_tokens: int, *, seed: int, batches: int
) -> Iterator[tuple[int, int, int, int]]:
    """(sentences, padded source length, padded target length, real target tokens) of the
    first ``batches`` batches a run draws: :func:`token_batches` of each epoch in turn, the
    order the translation task trains on.  For counting a run's FLOPs and tokens without
    running it."""
    drawn, epoch = 0, 0
    while drawn < batches:
        epoch_batches = token_batches(lengths, max_tokens, seed=seed, epoch=epoch)
        if not epoch_batches:
            raise ValueError("no batches: the data is empty")
        for b in epoch_batches:
            if drawn == batches:
                return
            targets = [lengths[i][1] for i in b]
            yield len(b), max(lengths[i][0] for i in b), max(targets), sum(targets)
            drawn += 1
        epoch += 1


def token_batches(
    lengths: Sequence[tuple[int, int]],
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[list[int]]:
    """Indices of examples grouped into batches whose padded size fits ``max_tokens`` per side.

    Raises ValueError naming the example if one pair alone exceeds the budget.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    for i, (s, t) in enumerate(lengths):
        if max(s, t) > max_tokens:
            raise ValueError(
                f"example {i} has {s} source and {t} target tokens, more than max_tokens={max_tokens}"
            )
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    tie = torch.rand(len(lengths), generator=g).tolist() if shuffle else [0.0] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i][0], lengths[i][1], tie[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    longest_s = longest_t = 0
    for i in order:
        s, t = lengths[i]
        ls, lt = max(longest_s, s), max(longest_t, t)
        if current and (len(current) + 1) * max(ls, lt) > max_tokens:
            batches.append(current)
            current, ls, lt = [], s, t
        current.append(i)
        longest_s, longest_t = ls, lt
    if current:
        batches.append(current)
    if shuffle:
        perm = torch.randperm(len(batches), generator=g).tolist()
        batches = [batches[p] for p in perm]
    return batches


def padding_fraction(lengths: Sequence[tuple[int, int]], batches: Sequence[Sequence[int]]) -> float:
    """Share of the padded source+target slots that are padding."""
    real = padded = 0
    for batch in batches:
        s = [lengths[i][0] for i in batch]
        t = [lengths[i][1] for i in batch]
        real += sum(s) + sum(t)
        padded += len(batch) * (max(s) + max(t))
    return 1.0 - real / padded if padded else 0.0


def pad(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """(B, max length) long tensor, right-padded."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
