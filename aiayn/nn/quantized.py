"""int8 weights for decoding: one scale per output channel, symmetric (absmax / 127).

Decoding one token at a time is bound by reading the weights: at batch 1 every step reads
every matrix once.  Stored as int8 with one fp32 scale per output row, a weight takes a
quarter of fp32's bytes:

    W ≈ s ⊙ Q,   Q = round(W / s) ∈ [-127, 127],   s_o = max_i |W_oi| / 127

so each element is off by at most s_o / 2 (``error_bound``).  Activations stay in
floating point.  ``Int8Linear`` is the plain computation -- ``F.linear`` of the
dequantized weight, the reference the tests hold the fast kernels to; which int8 kernel runs a
product on a CPU (fbgemm's dynamic int8 product, inside a decoding block) is chosen in
aiayn/nn/cpu_kernels.py, like every other kernel.

``quantize`` turns a model's linear layers -- attention, feed-forward and the output
projection -- into ``Int8Linear`` in place; embeddings and norms keep their precision.
A model so quantized saves and loads as it is (``config.quantization = "int8"``: the
checkpoint holds ``qweight`` and ``scale``, not the fp32 weights), so loading it does not
quantize again (``aiayn convert --quantize int8``).

Shapes: N rows, I in features, O out features.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.nn.linear import Linear

QMAX = 127  # symmetric: -127 .. 127 (-128 is never used, so -Q is always representable)


def quantize_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(O, I) float weight -> (O, I) int8 ``Q`` and (O,) fp32 scales ``s`` with W ≈ s ⊙ Q.
    A row of zeros gets the scale 1 (its Q is zero)."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / QMAX  # (O,)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def error_bound(scale: Tensor) -> Tensor:
    """The largest error of one weight of each row: half a quantization step, s_o / 2."""
    return scale / 2


class Int8Linear(nn.Module):
    """``y = x (s ⊙ Q)^T + b``: an int8 weight ``qweight`` (O, I) with fp32 scales ``scale``
    (O,), and a bias in the model's precision.  ``forward`` dequantizes and runs ``F.linear``:
    correct anywhere, fast nowhere; the CPU kernels replace it inside a decoding block."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(out_features))
        self.bias = nn.Parameter(torch.zeros(out_features), requires_grad=False) if bias else None

    qweight: Tensor
    scale: Tensor

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        """The int8 form of ``linear``'s weight (its bias kept as it is)."""
        m = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        q, s = quantize_weight(linear.weight)
        m.qweight.copy_(q)
        m.scale.copy_(s)
        if linear.bias is not None:
            assert m.bias is not None
            m.bias.data = linear.bias.detach().clone()
        return m.to(linear.weight.device)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Int8Linear:
        """``.to``, ``.cuda``, ``.bfloat16`` and the rest: the scales follow the device but stay
        fp32 whatever dtype the model is cast to (bf16 scales would move every weight by up to
        0.4%)."""
        scale = self.scale
        super()._apply(fn, recurse)
        self.scale = scale.to(self.scale.device)
        return self

    def dequantized(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """s ⊙ Q as a (O, I) float weight."""
        return (self.qweight.to(torch.float32) * self.scale[:, None]).to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized(x.dtype), bias)  # (..., I) -> (..., O)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize(model: nn.Module) -> nn.Module:
    """Replace every ``Linear`` of ``model`` by its ``Int8Linear``
    form, in place (a tied output projection gets an int8 copy; the embedding it shared keeps
    its own weight), and mark a model's config ``quantization="int8"`` so that it saves and
    loads so.  Returns ``model``."""
    _replace_linears(model, Int8Linear.from_linear)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "quantization"):
        model.config = config.replace(quantization="int8")
    return model


def int8_structure(model: nn.Module) -> nn.Module:
    """``model`` with empty ``Int8Linear`` layers in place of its linear ones: the shape
    a quantized checkpoint's weights are loaded into (nothing is quantized)."""

    def empty(child: Linear) -> Int8Linear:
        m = Int8Linear(child.in_features, child.out_features, child.bias is not None)
        return m.to(child.weight.device)

    return _replace_linears(model, empty)


def _replace_linears(model: nn.Module, make: Callable[[Linear], nn.Module]) -> nn.Module:
    """Every ``Linear`` of ``model`` replaced by ``make(it)``, in place."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Linear):
                setattr(parent, name, make(child))
    return model
