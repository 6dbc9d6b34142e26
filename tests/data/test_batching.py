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
        (len(b), max(lengths[i][0] for i in b), max(lengths[i][1] for i in b),
         sum(lengths[i][1] for i in b))
        for b in epochs[0] + epochs[1]
    ]  # fmt: skip
    n = len(epochs[0]) + 2
    assert list(batch_shapes(lengths, 120, seed=3, batches=n)) == want[:n]
    with pytest.raises(ValueError, match="empty"):
        list(batch_shapes([], 120, seed=3, batches=1))
