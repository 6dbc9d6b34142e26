"""The raw attention scores of a model, before the mask and the softmax.

``forward_with_weights`` gives the weights a model actually used.  To ask "what if" questions
of a trained head -- what would it look at with the causal mask lifted, how would it spread its
attention at another softmax temperature -- we need the scores ``Q K^T / sqrt(d_k)`` of Eq. (1)
for *every* query-key pair, masked ones included.

:func:`record_scores` runs one ordinary forward pass with every attention module routed through
a recording backend: it computes the full (B, H, T, S) score matrix, stores it with the name of
the module and the structural mask the module applied, and then attends exactly as the reference
backend does, so the model's outputs are unchanged.  :func:`reweight` turns a recorded score
matrix into weights at a chosen temperature, with or without the causal mask.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from aiayn.nn.attention import _reference, register_backend
from aiayn.nn.masks import structural_mask
from aiayn.nn.multihead import MultiHeadAttention

RECORDING_BACKEND = "record-scores"


@dataclass
class AttentionScores:
    """One attention module's scores on one batch.

    ``stream`` is "self" (decoder-only), "encoder", "decoder" (masked self-attention of an
    encoder-decoder) or "cross"; ``layer`` counts from 0 within the stream.
    """

    module: str
    stream: str
    layer: int
    scores: Tensor  # (B, H, T, S): q·k / sqrt(d_k) for every pair, no mask applied
    causal: bool  # the module applied the causal mask
    window: int | None  # ... and this sliding window


@dataclass
class _Recording:
    current: str | None
    calls: list[tuple[str, Tensor, bool, int | None]]


_ACTIVE: ContextVar[_Recording | None] = ContextVar("aiayn_record_scores", default=None)


def _recording_backend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    is_causal: bool,
    window: int | None,
    scale: float,
    dropout_p: float,
    return_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    rec = _ACTIVE.get()
    if rec is not None and rec.current is not None:
        groups = q.shape[-3] // k.shape[-3]
        keys = k.repeat_interleave(groups, dim=-3) if groups > 1 else k  # (B, H, S, D)
        scores = torch.matmul(q, keys.transpose(-2, -1)) * scale  # (B, H, T, S)
        rec.calls.append((rec.current, scores.detach().float(), is_causal, window))
    return _reference(
        q,
        k,
        v,
        mask,
        is_causal=is_causal,
        window=window,
        scale=scale,
        dropout_p=dropout_p,
        return_weights=return_weights,
    )


register_backend(RECORDING_BACKEND, _recording_backend)


def _stream(module_name: str, cross: bool, arch: str) -> str:
    if cross:
        return "cross"
    if arch == "encoder-decoder":
        return "encoder" if module_name.startswith("encoder.") else "decoder"
    return "encoder" if arch == "encoder" else "self"


@contextlib.contextmanager
def record_scores(model: nn.Module) -> Iterator[list[AttentionScores]]:
    """Within the block, every attention call of ``model`` appends its scores to the list.

    The list is filled when the block exits, in call order, with layers numbered per stream.
    """
    modules = {n: m for n, m in model.named_modules() if isinstance(m, MultiHeadAttention)}
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention modules to record")
    arch = getattr(getattr(model, "config", None), "arch", "decoder")
    rec = _Recording(None, [])
    saved = {n: m.backend for n, m in modules.items()}
    hooks = []
    for name, module in modules.items():

        def enter(_m: nn.Module, _args: object, name: str = name) -> None:
            rec.current = name

        hooks.append(module.register_forward_pre_hook(enter))
        module.backend = RECORDING_BACKEND
    token = _ACTIVE.set(rec)
    out: list[AttentionScores] = []
    try:
        yield out
    finally:
        _ACTIVE.reset(token)
        for hook in hooks:
            hook.remove()
        for name, module in modules.items():
            module.backend = saved[name]
    counts: dict[str, int] = {}
    for name, scores, causal, window in rec.calls:
        stream = _stream(name, modules[name].cross, arch)
        layer = counts.get(stream, 0)
        counts[stream] = layer + 1
        out.append(AttentionScores(name, stream, layer, scores, causal, window))


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
        raise ValueError(f"temperature={temperature!r} is invalid: expected a positive number")
    scaled = scores.float() / temperature
    mask = view_mask(scores.shape[-2], scores.shape[-1], causal, window)
    if mask is not None:
        scaled = scaled.masked_fill(~mask.to(scores.device), float("-inf"))
    return torch.softmax(scaled, dim=-1)
