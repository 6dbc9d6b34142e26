"""Faster CPU products for the model's linear layers: chosen once, applied by one explicit call.

``aiayn.nn.linear.Linear`` is a plain ``y = x W^T + b``.  How fast that product runs on
a CPU depends on the processor, the row count and whether gradients flow, and PyTorch's
default (``F.linear``, which on fp32 goes to MKL) is not always the fastest kernel it ships.
This module is the one place that knows it.  Callers that do a block of work hand the model
over once:

* training -- ``with for_training(model, kernel):`` where ``kernel`` came from
  ``choose_training_kernel`` (the trainer stores it with the run, so a resume takes the
  same kernel);
* decoding -- ``with for_decoding(model, rows) as plan:`` (generate, beam search, translate
  and the server's engine), where ``plan.gemv`` tells whether a one-row step runs on BLAS's
  own threads.

Inside the block each fp32 CPU ``Linear`` of the model has its class swapped for a
subclass whose ``forward`` runs the chosen kernel (same parameters, same ``state_dict``, same
hooks); on exit it gets its own class back.  Nothing is ever timed inside ``forward``: every
measurement happens when a block is entered, once per shape and process, and the decision is
logged once (logger ``aiayn.cpu_kernels``).  ``AIAYN_CPU_KERNELS=off`` turns all of it off:
the blocks then change nothing and every product is ``F.linear``.

The kernels:

* **oneDNN for training.**  On some processors (AMD's AVX-512 parts among them) MKL leaves
  half the machine's matrix throughput unused; oneDNN (``torch.ops.mkldnn``) does not.  The
  three products of a linear layer -- ``x W^T``, and backward ``dY W`` and ``dY^T x`` -- run
  on oneDNN where ``onednn_speedup`` measures it faster at the run's row count (about
  1.2-2.2x on AMD EPYC hosts, none on others).  oneDNN builds and keeps a kernel (and its
  scratch memory) for every row count it meets; token-count batches change their row count at
  every step, and a Multi30k run once grew by 0.4 GB every 20 steps to 7.8 GB.  Rows are
  therefore padded to a multiple of ``ROW_MULTIPLE``: a budget of N tokens meets at most N / 64
  row counts (the demo peaks at 1.18 GB RSS on oneDNN, 0.78 GB on MKL).  bf16 autocast
  training pads the same way, since there ``F.linear`` itself runs on oneDNN.
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

On an Intel Xeon (AMX) host aiayn's one-row generation ran at HF's speed through MKL: the
gains are a processor's property, which is why they are measured where the model runs.

Shapes: N rows (all leading dimensions flattened), I in features, O out features.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.device import best_seconds
from aiayn.errors import UserError
from aiayn.nn import int8_kernel
from aiayn.nn.int8_kernel import int8_dynamic_linear
from aiayn.nn.linear import Linear
from aiayn.nn.quantized import Int8Linear

log = logging.getLogger("aiayn.cpu_kernels")

TrainingKernel = Literal["mkl", "onednn"]
_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
MIN_ROWS = 16  # below this, oneDNN without a packed weight is slower than F.linear
# oneDNN compiles a kernel for each distinct row count it meets and keeps it for the life of
# the process: token-count batches have a new row count almost every step.  Rows are padded
# (with zeros) to a multiple of this, which bounds the distinct shapes to a few dozen at the
# cost of < 64 idle rows per product.
ROW_MULTIPLE = 64
# Inference with a packed weight meets fewer row counts (a decoding batch, a prefill chunk), so
# its rows are padded more finely: padding a short prefill to 64 rows cost a third of its time
# (docs/performance.md, "The measurements behind the kernels").
PACKED_ROW_MULTIPLE = 16


def enabled() -> bool:
    """False when ``AIAYN_CPU_KERNELS`` is ``off`` (or ``0``/``false``/``none``): then every
    block of this module leaves the model as it is."""
    return os.environ.get("AIAYN_CPU_KERNELS", "on").strip().lower() not in (
        "off",
        "0",
        "false",
        "none",
    )


@functools.cache
def _log_once(message: str) -> None:
    log.info(message)


# -- the products -------------------------------------------------------------------------


def _onednn(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def _pad_rows(x: Tensor, multiple: int = ROW_MULTIPLE) -> Tensor:
    """(N, F) -> (N', F) with N' the next multiple of ``multiple``, zero rows appended (up to
    that many rows are left as they are: there are few such shapes)."""
    extra = -x.shape[0] % multiple
    return F.pad(x, (0, 0, 0, extra)) if extra and x.shape[0] > multiple else x


class _OneDNNProducts(torch.autograd.Function):
    """The three products of a linear layer on oneDNN, on rows padded to ROW_MULTIPLE (zero
    rows add nothing to ``dW`` and their outputs are dropped)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
        n = x.shape[0]
        xp = _pad_rows(x)  # (N', I)
        ctx.save_for_backward(xp, w)
        ctx.has_bias, ctx.rows = b is not None, n
        return _onednn(xp, w, b)[:n]  # (N, O)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        xp, w = ctx.saved_tensors
        n = ctx.rows
        gp = _pad_rows(grad.contiguous())  # (N', O)
        dx = _onednn(gp, w.t(), None)[:n] if ctx.needs_input_grad[0] else None  # (N, I) = dY W
        dw = _onednn(gp.t(), xp.t(), None) if ctx.needs_input_grad[1] else None  # (O, I)
        db = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


_RowView = tuple[np.ndarray, np.ndarray | None]  # W^T (I, O) and b (O,): views, not copies


def _row_view(m: nn.Linear) -> _RowView:
    """Numpy views of ``m``'s weight, transposed, and bias: they share memory with the
    parameters, so an in-place update of the weights shows through them."""
    bias = None if m.bias is None else m.bias.detach().numpy()
    return m.weight.detach().numpy().T, bias


def _gemv(x: Tensor, w_t: np.ndarray, b: np.ndarray | None) -> Tensor:
    """(..., I) holding one row, times W^T (I, O) by BLAS's gemv -> (..., O)."""
    out = np.matmul(x.detach().reshape(1, -1).numpy(), w_t)  # (1, O)
    if b is not None:
        np.add(out, b, out=out)
    return torch.from_numpy(out).view(*x.shape[:-1], -1)


def _pack(m: nn.Linear, rows: int) -> Tensor:
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows)


def _plain_fp32(x: Tensor) -> bool:
    """An fp32 CPU input outside autocast and outside compilation: the kernels' domain."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
    )


# -- the layers swapped in ----------------------------------------------------------------


class TrainingLinear(Linear):
    """A ``Linear`` inside ``for_training``: fp32 products on oneDNN when the run
    chose it (``onednn``), and bf16/fp16 autocast rows padded to ROW_MULTIPLE."""

    onednn: bool = False

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if x.device.type != "cpu" or torch.compiler.is_compiling():
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])  # (N, I)
        if torch.is_autocast_enabled("cpu"):
            if not torch.is_grad_enabled() or rows <= ROW_MULTIPLE or rows % ROW_MULTIPLE == 0:
                return F.linear(x, self.weight, self.bias)
            # F.linear runs on oneDNN under CPU autocast, which keeps a kernel per row count
            out = F.linear(_pad_rows(flat), self.weight, self.bias)[:rows]  # (N, O)
        elif self.onednn and rows >= MIN_ROWS and x.dtype == self.weight.dtype == torch.float32:
            out = _OneDNNProducts.apply(flat, self.weight, self.bias)  # (N, O)
        else:
            return F.linear(x, self.weight, self.bias)
        return out.view(*x.shape[:-1], out.shape[-1])  # (..., O)


class DecodingLinear(Linear):
    """A ``Linear`` inside ``for_decoding``: without gradients, one row through gemv
    on views of the weight (``row_view``), several through a weight packed for oneDNN
    (``packed``); each is None where that kernel was not chosen."""

    packed: Tensor | None = None
    row_view: _RowView | None = None

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() or not _plain_fp32(x):
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows == 1 and self.row_view is not None:
            return _gemv(x, *self.row_view)
        if self.packed is None or rows == 0:
            return F.linear(x, self.weight, self.bias)
        flat = _pad_rows(x.reshape(rows, x.shape[-1]), PACKED_ROW_MULTIPLE)  # (N', I)
        out = _onednn(flat, self.packed, self.bias)[:rows]  # (N, O)
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
        out = int8_dynamic_linear(flat, self.qweight, self.handle)  # (N, O)
        return out.to(x.dtype).view(*x.shape[:-1], out.shape[-1])  # (..., O)


def _cpu_int8_layers(model: nn.Module) -> list[Int8Linear]:
    """The CPU ``Int8Linear`` layers of ``model``."""
    return [
        m for m in model.modules() if isinstance(m, Int8Linear) and m.qweight.device.type == "cpu"
    ]


def _cpu_fp32_layers(model: nn.Module) -> list[Linear]:
    """The fp32 CPU ``Linear`` layers of ``model``: those the kernels serve."""
    return [
        m
        for m in model.modules()
        if isinstance(m, Linear)
        and m.weight.device.type == "cpu"
        and m.weight.dtype == torch.float32
    ]


@contextmanager
def _swapped(
    layers: list[Any], cls: type[nn.Module], settings: Callable[[Any], dict[str, Any]]
) -> Iterator[None]:
    """Give each layer class ``cls`` and the attributes ``settings(layer)`` for the block.  A
    layer that already has ``cls`` (an outer block of the same kind) keeps its own class and
    gains only the attributes it lacks; everything set here is undone on exit."""
    undo: list[tuple[nn.Module, type[nn.Module] | None, list[str]]] = []
    base = cls.__bases__[0]  # Linear, or Int8Linear
    try:
        for m in layers:
            previous = type(m)
            if previous is not cls and previous is not base:
                continue  # another kind of block holds this layer: leave it alone
            m.__class__ = cls
            new = {k: v for k, v in settings(m).items() if v is not None and k not in vars(m)}
            for k, v in new.items():
                setattr(m, k, v)
            undo.append((m, previous if previous is not cls else None, list(new)))
        yield
    finally:
        for m, restore, names in reversed(undo):
            for k in names:
                delattr(m, k)
            if restore is not None:
                m.__class__ = restore


# -- training ---------------------------------------------------------------------------


@functools.cache
def onednn_speedup(rows: int, d_in: int, d_out: int, repeat: int = 5) -> float:
    """How much faster oneDNN runs a linear layer's three products than ``F.linear`` (MKL) on
    this host, for (rows, d_in) inputs and a (d_out, d_in) weight: the ratio of the best of
    ``repeat`` timings.  Measured once per shape and process; 0 where oneDNN is missing."""
    if not _ONEDNN:
        return 0.0
    gen = torch.Generator().manual_seed(0)  # not the global one: training's RNG stays as is
    x, w = torch.randn(rows, d_in, generator=gen), torch.randn(d_out, d_in, generator=gen)
    g = torch.randn(rows, d_out, generator=gen)

    def mkl() -> None:
        F.linear(x, w)
        g @ w
        g.t() @ x

    def onednn() -> None:
        _onednn(x, w, None)
        _onednn(g, w.t(), None)
        _onednn(g.t(), x.t(), None)

    mkl_s = best_seconds(mkl, repeat)
    return mkl_s / best_seconds(onednn, repeat)


def choose_training_kernel(
    setting: str, rows: int | None, d_model: int, cpu_fp32: bool
) -> tuple[TrainingKernel, str | None]:
    """The linear kernel of a new training run and a line saying why (None when nothing was
    measured): ``setting`` ("mkl" or "onednn") as given, or with "auto" oneDNN where it
    measures clearly faster (> 1.05x) than MKL on the run's rows of a (d_model, 4 d_model)
    feed-forward product, fp32 on a CPU; MKL when ``AIAYN_CPU_KERNELS=off``."""
    if not enabled():
        return "mkl", "linear layers: MKL (AIAYN_CPU_KERNELS=off)"
    if setting in ("mkl", "onednn"):
        return setting, None  # type: ignore[return-value]
    if setting != "auto":
        raise UserError(f"linear kernel {setting!r} is invalid: expected 'auto', 'mkl' or 'onednn'")
    if rows is None or not cpu_fp32:
        return "mkl", None
    speedup = onednn_speedup(rows, d_model, 4 * d_model)
    kernel: TrainingKernel = "onednn" if speedup > 1.05 else "mkl"
    why = (
        f"linear layers: {'oneDNN' if kernel == 'onednn' else 'MKL'} (oneDNN measured"
        f" {speedup:.2f}x MKL on ({rows}, {d_model}) x ({d_model}, {4 * d_model}) here)"
    )
    return kernel, why


@contextmanager
def for_training(model: nn.Module, kernel: str) -> Iterator[None]:
    """Within the block, ``model``'s fp32 CPU linear layers train on ``kernel`` ("onednn" or
    "mkl"; the bf16/fp16 autocast row padding applies to both).  Off with
    ``AIAYN_CPU_KERNELS=off``."""
    if kernel not in ("mkl", "onednn"):
        raise UserError(f"kernel {kernel!r} is invalid: expected 'mkl' or 'onednn'")
    if not enabled():
        yield
        return
    onednn = kernel == "onednn" and _ONEDNN
    with _swapped(_cpu_fp32_layers(model), TrainingLinear, lambda m: {"onednn": onednn}):
        yield


# -- decoding ---------------------------------------------------------------------------


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
    if kernel == "packed" and not _ONEDNN:
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
            _gemv(x, w_t, b_np)

    else:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)

        def alternative() -> None:
            _onednn(_pad_rows(x, PACKED_ROW_MULTIPLE), packed, b)

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
    _log_once(
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
    views = [_row_view(m) for m in layers]

    def by_linear() -> float:
        start = time.perf_counter()
        for m in layers:
            F.linear(xs[m.in_features], m.weight, m.bias)
        return time.perf_counter() - start

    def by_gemv() -> float:
        start = time.perf_counter()
        for m, view in zip(layers, views, strict=True):
            _gemv(xs[m.in_features], *view)
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
    layers = _cpu_fp32_layers(model) if enabled() else []
    gemv = _gemv_faster(layers)
    packed_shapes = {
        s
        for s in {_shape(m) for m in layers}
        if rows > 1 and decode_speedup("packed", rows, *s) > 1
    }
    if rows > 1 and layers:
        _log_once(
            f"decoding {rows} rows: packed weights for {len(packed_shapes)} of "
            f"{len({_shape(m) for m in layers})} weight shapes"
        )

    def settings(m: Linear) -> dict[str, Any]:
        return {
            "row_view": _row_view(m) if gemv else None,
            "packed": _pack(m, rows) if _shape(m) in packed_shapes else None,
        }

    int8 = _cpu_int8_layers(model) if enabled() else []

    def int8_settings(m: Int8Linear) -> dict[str, Any]:
        return {"handle": int8_kernel.packed(m)}

    with (
        _swapped(layers, DecodingLinear, settings),
        _swapped(int8, DecodingInt8Linear, int8_settings),
    ):
        yield DecodingPlan(
            gemv=bool(layers) and all(getattr(m, "row_view", None) is not None for m in layers),
            packed=sum(getattr(m, "packed", None) is not None for m in layers),
            int8_dynamic=sum(getattr(m, "handle", None) is not None for m in int8),
        )
