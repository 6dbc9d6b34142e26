"""Token-count batching: the shapes of the batches a run draws, epoch after epoch."""

from __future__ import annotations

import pytest
import torch


def test_batch_shapes_walk_the_epochs_a_run_draws() -> None:
    """The first n batches' shapes: epoch 0's token batches, then epoch 1's (reshuffled),
    each (sentences, longest source, longest target, real target tokens)."""
    from aiayn.data.batching import batch_shapes, token_batches

    g = torch.Generator().manual_seed(0)
    lengths = [(int(a), int(b)) for a, b in torch.randint(1, 30, (50, 2), generator=g)]
    epochs = [token_batches(lengths, 120, seed=3, epoch=e) for e in (0, 1)]
    want = [
        (
            len(b),
            max(lengths[i][0] for i in b),
            max(lengths[i][1] for i in b),
            sum(lengths[i][1] for i in b),
        )
        for b in epochs[0] + epochs[1]
    ]
    n = len(epochs[0]) + 2
    assert list(batch_shapes(lengths, 120, seed=3, batches=n)) == want[:n]
    with pytest.raises(ValueError, match="empty"):
        list(batch_shapes([], 120, seed=3, batches=1))


def greedy_batches(
    lengths: list[tuple[int, int]], max_tokens: int, seed: int, epoch: int, shuffle: bool
) -> list[list[int]]:
    """The batching rule written out, one sentence at a time (the oracle): sort by (source,
    target, a random tie), grow a batch while its size times its longest side fits."""
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    tie = torch.rand(len(lengths), generator=g).tolist() if shuffle else [0.0] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i][0], lengths[i][1], tie[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    ls = lt = 0
    for i in order:
        s, t = lengths[i]
        if current and (len(current) + 1) * max(ls, s, lt, t) > max_tokens:
            batches.append(current)
            current, ls, lt = [], 0, 0
        current.append(i)
        ls, lt = max(ls, s), max(lt, t)
    batches.append(current)
    if shuffle:
        batches = [batches[p] for p in torch.randperm(len(batches), generator=g).tolist()]
    return batches


@pytest.mark.parametrize("trial", range(12))
def test_the_vectorised_plan_is_the_rule_written_out(trial: int) -> None:
    """Random lengths with many ties (short ranges), budgets from tight to loose, shuffled
    and not: the same batches, in the same order, as the sentence-by-sentence rule."""
    import numpy as np

    from aiayn.data.batching import plan_batches

    g = torch.Generator().manual_seed(trial)
    n = int(torch.randint(1, 4000, (1,), generator=g))
    hi = int(torch.randint(2, 80, (1,), generator=g))
    lengths = [(int(a), int(b)) for a, b in torch.randint(1, hi, (n, 2), generator=g)]
    budget = int(torch.randint(hi, 700, (1,), generator=g))
    for shuffle in (True, False):
        want = greedy_batches(lengths, budget, trial, trial % 3, shuffle)
        arrays = tuple(np.asarray(side, dtype=np.uint16) for side in zip(*lengths, strict=True))
        plan = plan_batches(arrays, budget, seed=trial, epoch=trial % 3, shuffle=shuffle)  # type: ignore[arg-type]
        assert plan.lists() == want
