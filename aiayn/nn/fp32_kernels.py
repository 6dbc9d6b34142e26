"""The fp32 decoding products, as PyTorch operators that a compiled graph can hold.

Inside a decoding block (aiayn/nn/cpu_decoding.py) an fp32 layer multiplies one row by BLAS's
gemv on numpy views of its weight, and several rows by a weight that oneDNN has pre-arranged
("packed") for that row count.  Neither can be traced by ``torch.compile``: a numpy call is
not a tensor operation, and a packed weight is a oneDNN tensor.  Left to itself, a captured
step (aiayn/generate/captured.py) would run ``F.linear`` on the plain weight instead, and on
an AMD EPYC (Zen 4) that made a captured step slower than the eager one (docs/performance.md,
"A captured decoding step").  Both products are therefore operators with fake (shape-only)
implementations, as aiayn/nn/int8_kernel.py does for fbgemm's int8 weights:

* ``aiayn::gemv_linear`` -- one row by BLAS's gemv, on views of the weight made at each call;
* ``aiayn::packed_linear`` -- rows by oneDNN on a packed weight named by an integer handle.  A
  layer keeps one handle for the life of the process while its packed weight is made again
  at every decoding block and released on exit: the handle names whatever the layer's current
  packed weight is, so a step captured in one block runs unchanged in the next (the handle is
  a constant of the captured graph).  The table refers to packed weights weakly: a block's
  exit frees them.  Handles are numbered in the order layers are first packed, as
  aiayn/nn/int8_kernel.py numbers its own: a process that packs the same model's layers in
  the same order finds its step in inductor's disk cache, one that packed another model first
  compiles it again.

Shapes: N rows, I in features, O out features.
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch import Tensor, nn

from aiayn.nn import native_ops
from aiayn.nn.cpu_kernels import PACKED_ROW_MULTIPLE, gemv, onednn_linear, pad_rows

_WEIGHTS = native_ops.WeightTable("_native_set_packed", PACKED_ROW_MULTIPLE)  # handle -> weight
_NEXT = itertools.count()
_LAYER_HANDLES: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()


def register(layer: nn.Module, packed: Tensor) -> int:
    """Make ``packed`` the weight that ``layer``'s handle names; returns the handle."""
    handle = _LAYER_HANDLES.get(layer)
    if handle is None:
        handle = _LAYER_HANDLES[layer] = next(_NEXT)
        weakref.finalize(layer, _WEIGHTS.forget, handle)  # a freed layer leaves no entry
    _WEIGHTS.put(handle, packed)
    return handle


# Defined through ``torch.library.Library`` for the reason aiayn/nn/int8_kernel.py gives.
_LIB = torch.library.Library("aiayn", "FRAGMENT")
_LIB.define("packed_linear(Tensor x, Tensor weight, Tensor? bias, int handle) -> Tensor")
_LIB.define("gemv_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")


def _packed_linear(x: Tensor, weight: Tensor, bias: Tensor | None, handle: int) -> Tensor:
    """(N, I) fp32 rows times the packed weight ``handle``, plus ``bias`` -> (N, O).
    ``weight`` is the layer's plain (O, I) weight: it gives the fake implementation its
    shape."""
    packed = _WEIGHTS.get(handle)
    if packed is None:
        raise RuntimeError(f"packed weight {handle} is used outside its decoding block")
    rows = x.shape[0]
    return onednn_linear(pad_rows(x, PACKED_ROW_MULTIPLE), packed, bias)[:rows].contiguous()


def _gemv_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """(1, I) fp32 row times the (O, I) ``weight``, plus ``bias``, by BLAS's gemv -> (1, O)."""
    b = None if bias is None else bias.detach().numpy()
    return gemv(x, weight.detach().numpy().T, b)


# packed_linear's Python implementation serves every backend key; the C++ one of
# aiayn/nn/native_ops.py, once loaded, takes the CPU key ahead of it.  gemv_linear runs numpy's
# BLAS, which C++ does not reach.
_LIB.impl("packed_linear", _packed_linear, "CompositeExplicitAutograd")
_LIB.impl("gemv_linear", _gemv_linear, "CPU")


@torch.library.register_fake("aiayn::packed_linear", lib=_LIB)
def _(x: Tensor, weight: Tensor, bias: Tensor | None, handle: int) -> Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.register_fake("aiayn::gemv_linear", lib=_LIB)
def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


packed_linear = torch.ops.aiayn.packed_linear.default
gemv_linear = torch.ops.aiayn.gemv_linear.default
