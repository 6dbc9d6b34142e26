"""fbgemm's dynamic int8 product, as one PyTorch operator that a compiled graph can hold.

Decoding with int8 weights (``Int8Linear``) multiplies by fbgemm's
dynamic int8 kernel: each call quantizes its activations to 8 bits (one scale per call) and
multiplies int8 by int8 with VNNI or AMX, on the weight's own integers and scales packed once
per process.  fbgemm takes its packed weight as an opaque object, which ``torch.compile``
cannot trace; the product is therefore registered as the custom operator
``aiayn::int8_dynamic_linear`` with a fake (shape-only) implementation, and the packed weight
is named by an integer handle.  A captured decoding step (aiayn/generate/captured.py) then holds
every int8 product inside its one graph, with no graph break, and eager decoding runs the same
operator.

Handles are given in order of packing and refer to their packed weights weakly: the layer keeps
its packed weight alive (``packed``), and a freed model frees its weights.

Shapes: N rows, I in features, O out features.
"""

from __future__ import annotations

import itertools
import os
import warnings
import weakref
from typing import Any

import torch
from torch import Tensor

from aiayn.device import cpu_flags
from aiayn.errors import UserError
from aiayn.nn import native_ops
from aiayn.nn.quantized import Int8Linear

# Without VNNI, x86's 8-bit multiply-add saturates in 16 bits: fbgemm then needs activations
# of 7 bits (PyTorch's default for it); with VNNI (or AMX) the full 8 bits are exact.
CPU_HAS_VNNI = bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())
ACTIVATION_BITS_VAR = "AIAYN_INT8_ACTIVATION_BITS"


def _activation_bits(setting: str | None, vnni: bool) -> int:
    """The bits the int8 kernel quantizes activations to: ``setting`` (the value of
    ``AIAYN_INT8_ACTIVATION_BITS``: 7, or 8 where the CPU has VNNI), else the most the CPU
    computes exactly (8 with VNNI or AMX, 7 without).  7 bits run correctly everywhere, only
    less precisely: setting 7 on a VNNI machine reproduces another CPU's int8 numbers."""
    if setting is None or not setting.strip():
        return 8 if vnni else 7
    if setting.strip() == "7":
        return 7
    if setting.strip() == "8" and vnni:
        return 8
    raise UserError(
        f"{ACTIVATION_BITS_VAR}={setting!r}: expected 7, or 8 on a CPU with VNNI or AMX"
        + ("" if vnni else " (this one has neither: its 8-bit products saturate)")
    )


INT8_ACTIVATION_BITS = _activation_bits(os.environ.get(ACTIVATION_BITS_VAR), CPU_HAS_VNNI)
REDUCE_RANGE = INT8_ACTIVATION_BITS == 7  # fbgemm's flag for 7-bit activations
AVAILABLE = hasattr(torch.ops.quantized, "linear_dynamic")


def _dynamic_pack(qweight: Tensor, scale: Tensor, bias: Tensor | None) -> Any | None:
    """fbgemm's packed form of an int8 weight (the same integers and scales) for its dynamic
    int8 product, or None where this PyTorch lacks it.  It goes through PyTorch's quantized
    tensors, deprecated but still the way into fbgemm; their warning is silenced here."""
    if not AVAILABLE:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zeros = torch.zeros(qweight.shape[0], dtype=torch.long)
            q = torch._make_per_channel_quantized_tensor(qweight, scale.double(), zeros, 0)
            b = None if bias is None else bias.detach().float()
            return torch.ops.quantized.linear_prepack(q, b)
    except (RuntimeError, AttributeError):
        return None


_WEIGHTS = native_ops.WeightTable("_native_set_int8")  # handle -> packed weight (weakly)
_NEXT = itertools.count()
# Each int8 layer's packed weight and its handle, made once per process (packing is a pass
# over every weight), and made again only if the layer's weights change in place.
_PACKED: weakref.WeakKeyDictionary[Int8Linear, tuple[tuple[int, ...], Any, int]] = (
    weakref.WeakKeyDictionary()
)


def packed(m: Int8Linear) -> int | None:
    """The handle of ``m``'s packed weight for ``int8_dynamic_linear`` (packing it on first
    use), or None where fbgemm is missing."""
    versions = (m.qweight._version, m.scale._version, -1 if m.bias is None else m.bias._version)
    known = _PACKED.get(m)
    if known is None or known[0] != versions:
        weight = _dynamic_pack(m.qweight, m.scale, m.bias)
        if weight is None:
            return None
        handle = next(_NEXT)
        _WEIGHTS.put(handle, weight)
        known = versions, weight, handle
        _PACKED[m] = known
    return known[2]


# The operator is defined through ``torch.library.Library`` rather than the
# ``torch.library.custom_op`` decorator: the decorator's Python wrapper (autograd and
# mutation checks) cost two-thirds of a whole 512x512 product at four rows, and a Marian-small
# step makes some forty of them (docs/performance.md, "A captured decoding step").  Decoding
# needs no gradient.
_LIB = torch.library.Library("aiayn", "DEF")
_LIB.define(
    "int8_dynamic_linear(Tensor x, Tensor qweight, int handle, bool reduce_range) -> Tensor"
)


def _int8_dynamic_linear(x: Tensor, qweight: Tensor, handle: int, reduce_range: bool) -> Tensor:
    """(N, I) fp32 activations times the packed int8 weight ``handle`` (bias included) ->
    (N, O) fp32, the activations quantized to 7 bits where ``reduce_range`` (REDUCE_RANGE),
    else 8.  ``qweight`` is the layer's (O, I) int8 weight: it gives the fake implementation
    its shape."""
    weight = _WEIGHTS.get(handle)
    if weight is None:
        raise RuntimeError(f"int8 weight handle {handle} outlived its layer")
    return torch.ops.quantized.linear_dynamic(x, weight, reduce_range)


# The Python implementation serves every backend key; the C++ one of aiayn/nn/native_ops.py,
# once loaded, takes the CPU key ahead of it.
_LIB.impl("int8_dynamic_linear", _int8_dynamic_linear, "CompositeExplicitAutograd")


@torch.library.register_fake("aiayn::int8_dynamic_linear", lib=_LIB)
def _(x: Tensor, qweight: Tensor, handle: int, reduce_range: bool) -> Tensor:
    return x.new_empty((x.shape[0], qweight.shape[0]))


int8_dynamic_linear = torch.ops.aiayn.int8_dynamic_linear.default
