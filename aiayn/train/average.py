"""Checkpoint averaging (§6.1: "a single model obtained by averaging the last 5 checkpoints").

The element-wise mean of the parameters of models with one config; buffers are copied from the
last.  Averaging smooths the noise of the final steps of training, for a small, free gain.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from aiayn.checkpoint.model import load
from aiayn.config import differing_fields
from aiayn.models import TransformerModel


@torch.no_grad()
def average_checkpoints(directories: Sequence[str | os.PathLike[str]]) -> TransformerModel:
    if not directories:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    models = [load(d) for d in directories]
    first = models[0]
    for d, m in zip(directories[1:], models[1:], strict=True):
        if m.config != first.config:
            differ = ", ".join(
                f"{name} {getattr(m.config, name)!r} against {getattr(first.config, name)!r}"
                for name in differing_fields(m.config, first.config)
            )
            raise ValueError(f"cannot average {d} with {directories[0]}: {differ}")
    params = [dict(m.named_parameters()) for m in models]
    for name, p in params[-1].items():
        p.copy_(torch.stack([ps[name] for ps in params]).mean(0))
    return models[-1]
