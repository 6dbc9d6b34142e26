"""The CPU kernels of decoding (``with for_decoding(model, rows) as plan:``: generate, beam
search, translate and the server's engine), chosen as aiayn/nn/cpu_kernels.py chooses
training's: measured once per shape and process when the block is entered, the layers' classes
swapped for the block, ``AIAYN_CPU_KERNELS=off`` turning it off.

* **gemv for one-row decoding.**  Decoding multiplies one or a few rows per step and is bound
  by reading the weights.  One row goes to BLAS's ``sgemv`` -- numpy's matmul on a zero-copy
  view of the weight, made once on entry -- which reads memory faster than ``F.linear``'s
  path for one row on some hosts (AMD EPYC; the figures are in docs/performance.md, "The measurements behind the kernels").
  It goes to every layer or to none, by the time
  of a one-row pass through the model's own weights (``_gemv_seconds``): gemv runs on
  BLAS's own threads, which must not share the cores with torch's (``DecodingPlan``).
* **Packed weights for several rows.**  oneDNN with the weight pre-arranged ("packed") once
  for the block, per weight shape where ``decode_speedup`` measures it faster.  The packed
  copy costs as much memory as the weights; it is released on exit.

* **int8 weights** (``Int8Linear``, ``--quantize int8``): fbgemm's
  dynamic int8 product on the layer's own integers and scales, packed once per process
  (``DecodingInt8Linear``, through the operator of aiayn/nn/int8_kernel.py that a
  compiled step can hold): each call quantizes its activations to 8 bits and multiplies int8
  by int8.  Outside a decoding block an int8 layer dequantizes and runs ``F.linear``.
  bf16 weights need nothing here: ``F.linear`` in bf16 runs on oneDNN (AMX where the CPU has
  it).

Shapes: N rows (all leading dimensions flattened), I in features, O out features.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.device import best_seconds
from aiayn.errors import UserError
from aiayn.nn import fp32_kernels, int8_kernel
from aiayn.nn.cpu_kernels import (
    HAS_ONEDNN,
    PACKED_ROW_MULTIPLE,
    RowView,
    cpu_fp32_layers,
    cpu_int8_layers,
    enabled,
    fp32_cpu,
    gemv,
    log_once,
    make_row_view,
    onednn_linear,
    pack_weight,
    pad_rows,
    plain_fp32,
    swapped,
)
from aiayn.nn.fp32_kernels import gemv_linear, packed_linear
from aiayn.nn.int8_kernel import int8_dynamic_linear
from aiayn.nn.linear import Linear
from aiayn.nn.quantized import Int8Linear


class DecodingLinear(Linear):
    """A ``Linear`` inside ``for_decoding``: without gradients, one row through gemv
    on views of the weight (``row_view``), several through a weight packed for oneDNN
    (``packed``); each is None where that kernel was not chosen."""

    packed: Tensor | None = None
    packed_handle: int | None = None  # names ``packed`` inside a captured step
    row_view: RowView | None = None
    row_gemv: bool = False  # ``row_view`` is set (a flag a captured step can read)

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling() and not torch.is_grad_enabled():
            return self._captured(x)
        if torch.is_grad_enabled() or not plain_fp32(x):
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows == 1 and self.row_view is not None:
            return gemv(x, *self.row_view)
        if self.packed is None or rows == 0:
            return F.linear(x, self.weight, self.bias)
        flat = pad_rows(x.reshape(rows, x.shape[-1]), PACKED_ROW_MULTIPLE)  # (N', I)
        out = onednn_linear(flat, self.packed, self.bias)[:rows]  # (N, O)
        return out.view(*x.shape[:-1], out.shape[-1])  # (..., O)

    def _captured(self, x: Tensor) -> Tensor:
        """The product inside a step that ``torch.compile`` traces: the kernel the eager
        forward would take, as an operator of aiayn/nn/fp32_kernels.py that the graph holds."""
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows == 0 or not fp32_cpu(x):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])  # (N, I)
        if rows == 1 and self.row_gemv:
            out = gemv_linear(flat, self.weight, self.bias)  # (1, O)
        elif self.packed_handle is not None:
            out = packed_linear(flat, self.weight, self.bias, self.packed_handle)  # (N, O)
        else:
            return F.linear(x, self.weight, self.bias)
        return out.view(*x.shape[:-1], out.shape[-1])  # (..., O)


class DecodingInt8Linear(Int8Linear):
    """An ``Int8Linear`` inside ``for_decoding``: fbgemm's
    dynamic int8 product -- each call quantizes its activations to 8 bits (one scale per call)
    and multiplies int8 by int8 with VNNI -- on the weight's own integers and scales, packed
    once per process (``handle``).  It beat every other kernel PyTorch has for int8 weights
    at 1 to 256 rows (the weight-only ``_weight_int8pack_mm``, fp32 ``F.linear``; figures in
    docs/performance.md, "The measurements behind the kernels").  Where fbgemm is missing it falls back to the plain
    dequantizing forward."""

    handle: int | None = None  # fbgemm's packed weight (aiayn/nn/int8_kernel.py)

    def forward(self, x: Tensor) -> Tensor:
        if (
            self.handle is None
            or torch.is_grad_enabled()
            or x.device.type != "cpu"
            or x.dtype not in (torch.float32, torch.bfloat16)
        ):
            return super().forward(x)
        flat = x.reshape(-1, x.shape[-1]).float()  # (N, I): fbgemm takes fp32 activations
        bits7 = int8_kernel.REDUCE_RANGE  # read at call time: tests set it
        out = int8_dynamic_linear(flat, self.qweight, self.handle, bits7)  # (N, O)
        return out.to(x.dtype).view(*x.shape[:-1], out.shape[-1])  # (..., O)


@dataclass(frozen=True)
class DecodingPlan:
    """What ``for_decoding`` chose for a model.  ``gemv``: every layer runs a one-row
    product on BLAS's own threads, so a one-row step should give torch's small operations one
    thread (two thread pools spinning against each other slowed a small model's one-row
    decoding some 25-fold on an AMD EPYC host).  ``packed``: how many layers got a
    packed weight; ``int8_dynamic``: how many int8 layers run fbgemm's dynamic int8 product
    (the rest, where this PyTorch lacks it, their own dequantizing forward)."""

    gemv: bool = False
    packed: int = 0
    int8_dynamic: int = 0  # int8 layers on fbgemm's dynamic int8 product


def decode_speedup(kernel: str, rows: int, d_in: int, d_out: int) -> float:
    """How much faster ``kernel`` runs a (rows, d_in) x (d_in, d_out) product with bias,
    without gradients, than ``F.linear`` on this host: ``"gemv"`` (one row, numpy's BLAS on
    views of the weight) or ``"packed"`` (oneDNN on a weight packed for ``rows`` rows).
    Measured once per shape and process (``_decode_seconds``); 0 where the kernel is
    missing."""
    if kernel not in ("gemv", "packed"):
        raise UserError(f"kernel must be 'gemv' or 'packed', got {kernel!r}")
    if kernel == "packed" and not HAS_ONEDNN:
        return 0.0
    baseline, alternative = _decode_seconds(kernel, rows, d_in, d_out)
    return baseline / alternative


@functools.cache
def _decode_seconds(kernel: str, rows: int, d_in: int, d_out: int) -> tuple[float, float]:
    """Seconds per product through ``F.linear`` and through ``kernel``: the best of 5
    timings, each of enough calls to last about a millisecond.  The weight is a constant, not
    random: the speed does not depend on the values, and a 50k-word output layer's worth of
    ``randn`` would cost more than the measurement."""
    x, b = torch.full((rows, d_in), 0.5), torch.full((d_out,), 0.1)  # (N, I), (O,)
    w = torch.full((d_out, d_in), 0.01)  # (O, I)
    if kernel == "gemv":
        w_t, b_np = w.numpy().T, b.numpy()

        def alternative() -> None:
            gemv(x, w_t, b_np)

    else:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)

        def alternative() -> None:
            onednn_linear(pad_rows(x, PACKED_ROW_MULTIPLE), packed, b)

    calls = max(1, min(200, 5_000_000 // (d_in * d_out)))  # ~5 M weights read per timing

    def loop(fn: Any) -> Any:
        return lambda: [fn() for _ in range(calls)]

    with torch.no_grad():
        baseline = best_seconds(loop(lambda: F.linear(x, w, b)), 5) / calls
        return baseline, best_seconds(loop(alternative), 5) / calls


# (d_in, d_out) of each layer, in order -> seconds of a one-row pass by F.linear and by gemv
_GEMV_SECONDS: dict[tuple[tuple[int, int], ...], tuple[float, float]] = {}


def _shape(m: nn.Linear | Int8Linear) -> tuple[int, int]:
    return m.in_features, m.out_features


def _gemv_faster(layers: list[Linear]) -> bool:
    """Whether a one-row pass through these layers, in order, takes less time through gemv than
    through ``F.linear`` (``_gemv_seconds``; measured once per list of shapes and process)."""
    if not layers:
        return False
    key = tuple(_shape(m) for m in layers)
    if key not in _GEMV_SECONDS:
        _GEMV_SECONDS[key] = _gemv_seconds(layers)
    baseline, gemv = _GEMV_SECONDS[key]
    log_once(
        f"one-row decoding of {len(layers)} linear layers: {'gemv' if gemv < baseline else 'F.linear'}"
        f" (gemv {1e3 * gemv:.2f} ms, F.linear {1e3 * baseline:.2f} ms a pass here)"
    )
    return gemv < baseline


def _gemv_seconds(layers: list[Linear], budget_s: float = 0.1) -> tuple[float, float]:
    """Seconds of one one-row pass through ``layers``' own weights by ``F.linear`` and by gemv,
    the two passes alternating for about ``budget_s`` (3 to 15 rounds): medians.

    A pass reads every weight once, as a decoding step does: a model larger than the cache
    reads them from memory, and that is where gemv gains.  Timing each shape alone in a
    loop keeps its weight in cache and once called the two equal, sending a whole run to the
    slower kernel; alternating the passes keeps a host's drift out of the comparison."""
    xs = {m.in_features: torch.full((1, m.in_features), 0.5) for m in layers}  # (1, I)
    views = [make_row_view(m) for m in layers]

    def by_linear() -> float:
        start = time.perf_counter()
        for m in layers:
            F.linear(xs[m.in_features], m.weight, m.bias)
        return time.perf_counter() - start

    def by_gemv() -> float:
        start = time.perf_counter()
        for m, view in zip(layers, views, strict=True):
            gemv(xs[m.in_features], *view)
        return time.perf_counter() - start

    with torch.no_grad():
        first = by_linear() + by_gemv()  # also the warm-up
        rounds = max(3, min(15, int(budget_s / max(first, 1e-9))))
        pairs = [(by_linear(), by_gemv()) for _ in range(rounds)]
    return statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)


@contextmanager
def for_decoding(model: nn.Module, rows: int) -> Iterator[DecodingPlan]:
    """Within the block, ``model`` decodes ``rows`` rows per step (``rows`` is a hint: a step
    may have fewer): weights packed for oneDNN when there are several, per weight shape where
    packing measures faster than ``F.linear``, and for a step down to one row, gemv on views of
    the weights -- for the whole model or not at all.  Blocks nest: an inner block keeps (and
    leaves) what an outer one set, so a caller that decodes many batches measures and packs
    once (aiayn/generate/translate.py).  Replacing a weight tensor (rather than updating it in
    place) inside the block is not seen.  Off with ``AIAYN_CPU_KERNELS=off``."""
    layers = cpu_fp32_layers(model) if enabled() else []
    gemv = _gemv_faster(layers)
    packed_shapes = {
        s
        for s in {_shape(m) for m in layers}
        if rows > 1 and decode_speedup("packed", rows, *s) > 1
    }
    if rows > 1 and layers:
        log_once(
            f"decoding {rows} rows: packed weights for {len(packed_shapes)} of "
            f"{len({_shape(m) for m in layers})} weight shapes"
        )

    def settings(m: Linear) -> dict[str, Any]:
        # an outer block's packed weight stays (and keeps its handle)
        pack = _shape(m) in packed_shapes and "packed" not in vars(m)
        packed = pack_weight(m, rows) if pack else None
        return {
            "row_view": make_row_view(m) if gemv else None,
            "row_gemv": True if gemv else None,
            "packed": packed,
            "packed_handle": None if packed is None else fp32_kernels.register(m, packed),
        }

    int8 = cpu_int8_layers(model) if enabled() else []

    def int8_settings(m: Int8Linear) -> dict[str, Any]:
        return {"handle": int8_kernel.packed(m)}

    with (
        swapped(layers, DecodingLinear, settings),
        swapped(int8, DecodingInt8Linear, int8_settings),
    ):
        yield DecodingPlan(
            gemv=bool(layers) and all(getattr(m, "row_view", None) is not None for m in layers),
            packed=sum(getattr(m, "packed", None) is not None for m in layers),
            int8_dynamic=sum(getattr(m, "handle", None) is not None for m in int8),
        )
