"""Normalisation layers, chosen by name through aiayn/registry.py.

* LayerNorm (Ba et al., 2016), the paper's choice: ``LayerNorm(x + Sublayer(x))`` (§3.1).
  Subtract the mean, divide by the standard deviation over the features, then a learned gain
  and bias.
* RMSNorm (Zhang & Sennrich, 2019), Llama's choice: no mean subtraction and no bias,
  ``x / sqrt(mean(x^2) + eps) * g``.

Both are PyTorch's own fused modules; this file chooses between them and documents the maths
(tests/nn/test_norms_feedforward.py checks both against the formulas written out).
"""

from __future__ import annotations

from torch import nn

from aiayn import registry


def layer_norm(d_model: int, eps: float, bias: bool = True) -> nn.Module:
    return nn.LayerNorm(d_model, eps=eps, bias=bias)


def rms_norm(d_model: int, eps: float, bias: bool = True) -> nn.Module:
    return nn.RMSNorm(d_model, eps=eps)  # no bias, by definition


def build_norm(kind: str, d_model: int, eps: float, bias: bool = True) -> nn.Module:
    """The norm registered as ``kind`` over the last ``d_model`` features."""
    module: nn.Module = registry.resolve("norm", kind)(d_model, eps, bias)
    return module
