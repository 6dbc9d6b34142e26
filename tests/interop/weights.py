"""Helpers for the weight-conversion tests: weights moved off HF's initial values (so that a
swapped or dropped norm, bias or embedding changes the output), and state dicts compared name
by name (not paired by position)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

import torch

M = TypeVar("M", bound=torch.nn.Module)


def perturb(model: M, names: Iterable[str]) -> M:
    """``model`` with every bias and every parameter whose name holds one of ``names`` (norms,
    embeddings) moved by 0.1 N(0, 1), in place.  HF initialises norms to (1, 0) and biases to
    0: left so, two swapped norms or a dropped bias convert to the same output."""
    parts = tuple(names)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or any(part in name for part in parts):
                p.add_(0.1 * torch.randn_like(p))
    return model


def assert_same_state(
    got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor], what: str = "state"
) -> None:
    """The same names, and under each name an equal tensor (dtype and shape included)."""
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    assert not missing and not extra, f"{what}: missing {missing}, unexpected {extra}"
    differ = [_difference(n, got[n], want[n]) for n in want]
    differ = [d for d in differ if d]
    assert not differ, f"{what}: {len(differ)} of {len(want)} tensors differ: {differ[:6]}"


def _difference(name: str, got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when equal; else the name and how the two differ (torch.equal ignores dtype)."""
    if got.dtype != want.dtype:
        return f"{name}: dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    return "" if torch.equal(got, want) else f"{name}: values"
