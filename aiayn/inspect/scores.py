"""The raw attention scores of a model, before the mask and the softmax.

``forward_with_weights`` gives the weights a model actually used.  To ask "what if" questions
of a trained head -- what would it look at with the causal mask lifted, how would it spread its
attention at another softmax temperature -- we need the scores ``Q K^T / sqrt(d_k)`` of Eq. (1)
for *every* query-key pair, masked ones included.

``recorded_scores`` runs one ordinary forward pass with a ``Record``
that asks every attention module for its scores (the model's outputs are unchanged: the same
modules, the reference backend).  ``reweight`` turns a recorded score matrix into weights
at a chosen temperature, with or without the causal mask.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.errors import UserError
from aiayn.nn.context import AttentionRecord, Record
from aiayn.nn.masks import structural_mask

AttentionScores = AttentionRecord  # one module's scores (and causal / window) on one batch


def recorded_scores(model: nn.Module, *inputs: Any, **kwargs: Any) -> list[AttentionRecord]:
    """Every attention module's scores for ``model(*inputs, **kwargs)``, in call order, with
    layers numbered per stream ("self", "encoder", "decoder", "cross")."""
    record = Record(scores=True)
    # An encoder without a masked-LM head (a sentence-embedding BERT) has no logits to give,
    # but its attention is the same: run its stack alone.
    run = getattr(model, "encode", model) if getattr(model, "head", True) is None else model
    with torch.no_grad():
        run(*inputs, record=record, **kwargs)
    if not record.attention:
        raise UserError(f"{type(model).__name__} has no attention modules to record")
    return record.attention


def view_mask(t: int, s: int, causal: bool, window: int | None) -> Tensor | None:
    """The (T, S) mask of a view: causal -- within ``window`` if the layer has one -- or none."""
    return structural_mask(t, s, causal, window if causal else None)


def reweight(
    scores: Tensor, *, temperature: float = 1.0, causal: bool = False, window: int | None = None
) -> Tensor:
    """(..., T, S) scores -> weights ``softmax(scores / temperature)``, optionally causal.

    With ``causal`` the query i (at position S - T + i) may not see later keys -- nor, with a
    sliding ``window``, keys ``window`` or more positions back -- and those weights are exactly
    0.  ``temperature`` < 1 sharpens each row, > 1 flattens it; 1 gives back what the layer
    computed (when ``causal`` and ``window`` match the model's own mask).
    """
    if (
        not (isinstance(temperature, int | float) and math.isfinite(temperature))
        or temperature <= 0
    ):
        raise UserError(f"temperature={temperature!r} is invalid: expected a positive number")
    scaled = scores.float() / temperature
    mask = view_mask(scores.shape[-2], scores.shape[-1], causal, window)
    if mask is not None:
        scaled = scaled.masked_fill(~mask.to(scores.device), float("-inf"))
    return torch.softmax(scaled, dim=-1)
