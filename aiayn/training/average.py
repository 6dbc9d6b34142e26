"""Checkpoint averaging (§6.1: "a single model obtained by averaging the last 5 checkpoints").

The element-wise mean of the parameters of models with one config; buffers are copied from the
last.  Averaging smooths the noise of the final steps of training, for a small, free gain.
``write_average`` is what ``aiayn average`` does: it checks that the models share one
vocabulary, averages them, and saves the average with the last one's tokenizer and run config.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.checkpoint.bundle import TOKENIZER_FILE, save_with_companions
from aiayn.checkpoint.model import load_model
from aiayn.config import differing_fields
from aiayn.errors import UserError
from aiayn.models import TransformerModel


@torch.no_grad()
def average_checkpoints(directories: Sequence[str | os.PathLike[str]]) -> TransformerModel:
    if not directories:
        raise UserError("average_checkpoints needs at least one checkpoint")
    models = [load_model(d) for d in directories]
    first = models[0]
    for d, m in zip(directories[1:], models[1:], strict=True):
        if m.config != first.config:
            differ = ", ".join(
                f"{name} {m.config.value(name)!r} against {first.config.value(name)!r}"
                for name in differing_fields(m.config, first.config)
            )
            raise UserError(f"cannot average {d} with {directories[0]}: {differ}")
    params = [dict(m.named_parameters()) for m in models]
    for name, p in params[-1].items():
        p.copy_(torch.stack([ps[name] for ps in params]).mean(0))
    return models[-1]


def check_same_tokenizer(directories: Sequence[str | os.PathLike[str]]) -> None:
    """One vocabulary: the average keeps the last checkpoint's tokenizer, and a token id must
    mean the same in every model averaged.  Raises ValueError naming the first that differs."""
    first = Path(directories[0]) / TOKENIZER_FILE
    for other in directories[1:]:
        path = Path(other) / TOKENIZER_FILE
        if first.is_file() != path.is_file() or (
            first.is_file() and first.read_bytes() != path.read_bytes()
        ):
            raise UserError(
                f"cannot average {other} with {directories[0]}: their tokenizers"
                f" ({TOKENIZER_FILE}) differ, so their token ids do not mean the same"
            )


def write_average(
    directories: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]
) -> Path:
    """Average the checkpoints ``directories`` into the folder ``out`` (written atomically),
    with the last one's tokenizer and run config: the average translates and evaluates
    directly."""
    if not directories:
        raise UserError("average_checkpoints needs at least one checkpoint")
    check_same_tokenizer(directories)
    model = average_checkpoints(directories)
    return save_with_companions(model, out, directories[-1])
