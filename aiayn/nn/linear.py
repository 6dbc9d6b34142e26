"""The linear layer every projection of the model uses: ``y = x W^T + b``.

On CPU in fp32, PyTorch's ``F.linear`` runs through MKL, which on some processors (AMD's
AVX-512 parts among them) leaves half the machine's matrix throughput unused.  PyTorch also
ships oneDNN (``torch.ops.mkldnn``), which does not.  This layer sends the three matrix
products of a linear layer -- forward ``x W^T``, and backward ``dY W`` and ``dY^T x`` -- to
oneDNN when that helps, and to ``F.linear`` everywhere else (GPUs, other dtypes, autocast,
tiny inputs).  Same maths, same parameters, same ``state_dict`` as ``torch.nn.Linear``; the
results agree to fp32 rounding (tests/nn/test_linear.py), and ``benchmarks/`` measures the
speed against the plain path in the same run.

The unpacked oneDNN path is off unless a caller turns it on with :func:`use_onednn` (the
trainer does where oneDNN measures faster at the run's row count: aiayn/train/loop.py).
oneDNN builds and keeps a kernel (and its scratch memory) for every row count it meets.  For a
model trained on fixed shapes (a language model's B × T windows) that is one set of kernels;
token-count batches change their row count at every step, and a Multi30k run once grew by 0.4
GB every 20 steps to 7.8 GB.  Rows are therefore padded to a multiple of ``ROW_MULTIPLE``: a
budget of N tokens meets at most N / 64 row counts (the demo peaks at 1.18 GB RSS on oneDNN,
0.78 GB on MKL).  bf16 autocast training pads the same way: there ``F.linear`` itself runs on
oneDNN.

Decoding multiplies one or a few rows per step, and is bound by reading the weights.  One row
(without gradients) goes to BLAS's ``sgemv`` -- numpy's matmul on a zero-copy view of the
weight, which reads memory at about 2.5x the rate of ``F.linear``'s path for one row here.
Within a decoding block (:func:`packed_for_rows`) those numpy views are made once, not per
call: a 384 x 384 one-row product took 15.6 us through the per-call checks and views and 7.9
us from views made once (F.linear: 9.8 us), and a 6-layer model makes 25 such products per
token.  Several rows go to oneDNN with the weight pre-arranged ("packed") once:
:func:`packed_for_inference` does that for the duration of a ``with`` block, and generation
uses it.

Both decoding kernels are a processor's property, like oneDNN's training speed-up: the gemv
and packed-weight gains were measured on AMD EPYC hosts, and on an Intel Xeon (AMX) host
aiayn's one-row generation ran at HF's speed, whose ``F.linear`` goes to MKL.  So
:func:`packed_for_rows` measures them against ``F.linear`` on the running host, once per
weight shape and process (:func:`decode_speedup`): a layer gets a packed weight where packing
is faster for its shape; gemv goes to every layer or to none, by the time of a one-row pass
through the model's own weights (:func:`_gemv_seconds`; gemv runs on BLAS's own threads,
which must not share the cores with torch's: see :func:`on_gemv`).

Shapes: N rows (all leading dimensions flattened), I in features, O out features.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.device import best_seconds

_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
MIN_ROWS = 16  # below this, oneDNN without a packed weight is slower than F.linear
# oneDNN compiles a kernel for each distinct row count it meets and keeps it for the life of
# the process: token-count batches have a new row count almost every step, and a Multi30k run
# grew by gigabytes of such kernels.  Rows are padded (with zeros) to a multiple of this, which
# bounds the distinct shapes to a few dozen at the cost of < 64 idle rows per product.
ROW_MULTIPLE = 64


def _onednn(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


# Inference with a packed weight meets fewer row counts (a decoding batch, a prefill chunk), so
# its rows are padded more finely: a 68-token prefill of a 6-layer, 384-wide model took 9.3 ms
# padded to 128 rows and 6.5 ms padded to 80.
PACKED_ROW_MULTIPLE = 16


def _pad_rows(x: Tensor, multiple: int | None = None) -> Tensor:
    """(N, F) -> (N', F) with N' the next multiple of ``multiple`` (ROW_MULTIPLE), zero rows
    appended (up to that many rows are left as they are: there are few such shapes)."""
    multiple = ROW_MULTIPLE if multiple is None else multiple
    extra = -x.shape[0] % multiple
    return F.pad(x, (0, 0, 0, extra)) if extra and x.shape[0] > multiple else x


class _OneDNNLinear(torch.autograd.Function):
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


_enabled = False  # the unpacked path, for inputs with fixed shapes (see the module docstring)


@contextmanager
def use_onednn(enabled: bool = True) -> Iterator[None]:
    """Within the block, :class:`Linear` layers run their products on oneDNN (when the input
    qualifies).  Use it for work whose shapes repeat; packed inference weights are used
    whatever this says."""
    global _enabled
    previous, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = previous


@functools.cache
def onednn_speedup(rows: int, d_in: int, d_out: int, repeat: int = 5) -> float:
    """How much faster oneDNN runs a linear layer's three products than ``F.linear`` (MKL) on
    this host, for (rows, d_in) inputs and a (d_out, d_in) weight: the ratio of the best of
    ``repeat`` timings.  Measured once per shape and process; 0 where oneDNN is missing.

    The gain is a property of the processor (about 1.2-2.2x on AMD EPYC hosts of this kind,
    none on others), so it is measured where the model runs rather than assumed.
    """
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


def _low_precision_training(x: Tensor) -> bool:
    """bf16 / fp16 autocast on a CPU, with gradients (training's forward pass)."""
    return (
        x.device.type == "cpu"
        and torch.is_autocast_enabled("cpu")
        and torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
    )


def _fast_path(x: Tensor, w: Tensor) -> bool:
    return (
        _ONEDNN
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and w.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )


class Linear(nn.Linear):
    """``torch.nn.Linear`` with the oneDNN fast path on CPU (see the module docstring)."""

    packed: Tensor | None = None  # set inside packed_for_inference()
    row_view: _RowView | None = None  # set inside gemv_views()
    gemv_off: bool | None = None  # True inside a packed_for_rows() block that rejected gemv

    def forward(self, x: Tensor) -> Tensor:
        view = self.row_view
        if (
            view is not None
            and x.numel() == x.shape[-1] > 0  # one row
            and x.dtype == torch.float32
            and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling()
        ):
            return _gemv(x, *view)
        if torch.jit.is_scripting():
            return F.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows > ROW_MULTIPLE and rows % ROW_MULTIPLE and _low_precision_training(x):
            # bf16 autocast on a CPU: F.linear runs on oneDNN, which keeps a kernel per row
            # count, so token-count batches get the same padding as the fp32 path.
            flat = _pad_rows(x.reshape(rows, x.shape[-1]))  # (N', I)
            return F.linear(flat, self.weight, self.bias)[:rows].view(*x.shape[:-1], -1)
        if not _fast_path(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, x.shape[-1])  # (N, I)
        if (
            rows == 1
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and self.gemv_off is None
            and decode_speedup("gemv", 1, self.in_features, self.out_features) > 1
        ):
            return _gemv(x, *_row_view(self))
        if self.packed is not None and not torch.is_grad_enabled():
            out = _onednn(_pad_rows(flat, PACKED_ROW_MULTIPLE), self.packed, self.bias)[:rows]
        elif not _enabled or rows < MIN_ROWS or torch.compiler.is_compiling():
            return F.linear(x, self.weight, self.bias)
        else:
            out = _OneDNNLinear.apply(flat, self.weight, self.bias)
        return out.view(*x.shape[:-1], out.shape[-1])  # (..., O)


_RowView = tuple[np.ndarray, np.ndarray | None]  # W^T (I, O) and b (O,): views, not copies


def _row_view(m: Linear) -> _RowView:
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


@contextmanager
def _per_layer(model: nn.Module, attr: str, make: Any) -> Iterator[None]:
    """Set ``attr`` = ``make(layer)`` on every fp32 CPU :class:`Linear` of ``model`` that has
    none, for the block; an inner block keeps (and leaves) what an outer one set."""
    layers = [m for m in _decoding_layers(model) if getattr(m, attr) is None]
    # make(m) may return None: the layer keeps F.linear
    try:
        for m in layers:
            setattr(m, attr, make(m))
        yield
    finally:
        for m in layers:
            setattr(m, attr, None)


def gemv_views(model: nn.Module) -> AbstractContextManager[None]:
    """Within the block, a one-row input to any fp32 CPU :class:`Linear` of ``model`` goes to
    gemv through numpy views of the weight made on entry (module docstring).  Blocks nest as
    :func:`packed_for_inference`'s do.  Replacing a weight tensor (rather than updating it in
    place) inside the block is not seen."""
    return _per_layer(model, "row_view", _row_view)


@contextmanager
def packed_for_rows(model: nn.Module, rows: int) -> Iterator[None]:
    """What decoding ``rows`` rows per step wants: weights packed for oneDNN when there are
    several (as :func:`packed_for_inference`), and for a step down to one row, BLAS's gemv on
    views of the weights themselves (as :func:`gemv_views`) -- each only where it runs faster
    than ``F.linear`` on this host (:func:`decode_speedup`): packing per weight shape, gemv for
    the whole model or not at all."""

    def pack(m: Linear) -> Tensor | None:
        return _pack(m, rows) if decode_speedup("packed", rows, *_shape(m)) > 1 else None

    # gemv is all or nothing: it runs on BLAS's own threads, and a one-row step then gives
    # torch's threads up (on_gemv); a model mixing the two, its torch threads spinning beside
    # BLAS's, ran a 6-layer model's one-row decoding at 10 tokens/s instead of 250 here.  So
    # every layer goes to gemv if a one-row pass through the model's weights runs faster so.
    gemv = _gemv_faster(_decoding_layers(model))
    packing = _per_layer(model, "packed", pack) if rows > 1 else nullcontext()
    one_row = (
        _per_layer(model, "row_view", _row_view)
        if gemv
        else _per_layer(model, "gemv_off", lambda m: True)
    )  # off for every layer, the one-row path outside blocks included
    with packing, one_row:
        yield


# (d_in, d_out) of each layer, in order -> seconds of a one-row pass by F.linear and by gemv
_GEMV_SECONDS: dict[tuple[tuple[int, int], ...], tuple[float, float]] = {}


def _gemv_faster(layers: list[Linear]) -> bool:
    """Whether a one-row pass through these layers, in order, takes less time through gemv than
    through ``F.linear`` (:func:`_gemv_seconds`; measured once per list of shapes and process)."""
    if not layers:
        return False
    key = tuple(_shape(m) for m in layers)
    if key not in _GEMV_SECONDS:
        _GEMV_SECONDS[key] = _gemv_seconds(layers)
    baseline, gemv = _GEMV_SECONDS[key]
    return gemv < baseline


def _gemv_seconds(layers: list[Linear], budget_s: float = 0.1) -> tuple[float, float]:
    """Seconds of one one-row pass through ``layers``' own weights by ``F.linear`` and by gemv,
    the two passes alternating for about ``budget_s`` (3 to 15 rounds): medians.

    A pass reads every weight once, as a decoding step does: a model larger than the cache
    reads them from memory, and that is where gemv gains (on an AMD EPYC host, 6 layers of
    width 384, 42 MB: 2.5 ms by ``F.linear``, 1.1 ms by gemv).  Timing each shape alone in a
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


def on_gemv(model: nn.Module) -> bool:
    """Whether every fp32 CPU :class:`Linear` of ``model`` has gemv views (inside
    :func:`packed_for_rows`, on a host where gemv measured faster): then a one-row decoding
    step runs all its products on BLAS's own threads, and its callers give torch's small
    operations one thread so that the two thread pools do not spin against each other."""
    layers = _decoding_layers(model)
    return bool(layers) and all(m.row_view is not None for m in layers)


def _decoding_layers(model: nn.Module) -> list[Linear]:
    """The fp32 CPU :class:`Linear` layers of ``model``: those the decoding kernels serve."""
    return [m for m in model.modules() if isinstance(m, Linear) and _fast_path(m.weight, m.weight)]


def _shape(m: Linear) -> tuple[int, int]:
    return m.in_features, m.out_features


def decode_speedup(kernel: str, rows: int, d_in: int, d_out: int) -> float:
    """How much faster ``kernel`` runs a (rows, d_in) x (d_in, d_out) product with bias,
    without gradients, than ``F.linear`` on this host: ``"gemv"`` (one row, numpy's BLAS on
    views of the weight) or ``"packed"`` (oneDNN on a weight packed for ``rows`` rows).
    Measured once per shape and process (:func:`_decode_seconds`); 0 where the kernel is
    missing."""
    if kernel not in ("gemv", "packed"):
        raise ValueError(f"kernel must be 'gemv' or 'packed', got {kernel!r}")
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

    calls = max(1, min(200, 5_000_000 // (d_in * d_out)))  # ~1 ms reading the weight

    def loop(fn: Any) -> Any:
        return lambda: [fn() for _ in range(calls)]

    with torch.no_grad():
        baseline = best_seconds(loop(lambda: F.linear(x, w, b)), 5) / calls
        return baseline, best_seconds(loop(alternative), 5) / calls


@contextmanager
def packed_for_inference(model: nn.Module, rows: int = 1) -> Iterator[None]:
    """Within the block, every :class:`Linear` of ``model`` running without gradients uses a
    weight packed once for oneDNN (``rows`` is a hint of the rows per call).  The packed copy
    costs as much memory as the weights; it is released on exit.  Blocks nest: an inner
    block keeps (and leaves) the packing of an outer one, so a caller that decodes many
    batches packs once (aiayn/generate/translate.py)."""
    # gemv_views: for a step that is down to one row (a lone request)
    with _per_layer(model, "packed", lambda m: _pack(m, rows)), gemv_views(model):
        yield


def _pack(m: Linear, rows: int) -> Tensor:
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows)
