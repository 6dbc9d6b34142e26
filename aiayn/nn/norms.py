"""Normalisation layers.

* LayerNorm (Ba et al., 2016), the paper's choice: ``LayerNorm(x + Sublayer(x))`` (§3.1).
  Subtract the mean, divide by the standard deviation over the features, then a learned gain
  and bias.
* RMSNorm (Zhang & Sennrich, 2019), Llama's choice: no mean subtraction and no bias,
  ``x / sqrt(mean(x^2) + eps) * g``.

Both are PyTorch's own fused modules; this file chooses between them and documents the maths
(tests/nn/test_norms.py checks both against the formulas written out).
"""

from __future__ import annotations

from torch import nn

from aiayn.config import Norm


def build_norm(kind: Norm, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """A LayerNorm or RMSNorm over the last ``d_model`` features."""
    if kind == "layernorm":
        return nn.LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return nn.RMSNorm(d_model, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; expected 'layernorm' or 'rmsnorm'")
