"""Faster CPU products for the model's linear layers: chosen once, applied by one explicit call.

``aiayn.nn.linear.Linear`` is a plain ``y = x W^T + b``.  How fast that product runs on
a CPU depends on the processor, the row count and whether gradients flow, and PyTorch's
default (``F.linear``, which on fp32 goes to MKL) is not always the fastest kernel it ships.
This module and aiayn/nn/cpu_decoding.py are the one place that knows it.  Callers that do a
block of work hand the model over once:

* training -- ``with for_training(model, kernel):`` where ``kernel`` came from
  ``choose_training_kernel`` (the trainer stores it with the run, so a resume takes the
  same kernel);
* decoding -- ``with cpu_decoding.for_decoding(model, rows) as plan:`` (generate, beam search, translate
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
* **Decoding** (``for_decoding``): gemv for one row, packed oneDNN weights for several, fbgemm's
  int8 product for int8 weights -- aiayn/nn/cpu_decoding.py.

On an Intel Xeon (AMX) host aiayn's one-row generation ran at HF's speed through MKL: the
gains are a processor's property, which is why they are measured where the model runs.

Shapes: N rows (all leading dimensions flattened), I in features, O out features.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.device import best_seconds
from aiayn.errors import UserError
from aiayn.nn.linear import Linear
from aiayn.nn.quantized import Int8Linear

log = logging.getLogger("aiayn.cpu_kernels")

TrainingKernel = Literal["mkl", "onednn"]
HAS_ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
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
def log_once(message: str) -> None:
    log.info(message)


# -- the products -------------------------------------------------------------------------


def onednn_linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


def pad_rows(x: Tensor, multiple: int = ROW_MULTIPLE) -> Tensor:
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
        xp = pad_rows(x)  # (N', I)
        ctx.save_for_backward(xp, w)
        ctx.has_bias, ctx.rows = b is not None, n
        return onednn_linear(xp, w, b)[:n]  # (N, O)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        xp, w = ctx.saved_tensors
        n = ctx.rows
        gp = pad_rows(grad.contiguous())  # (N', O)
        dx = (
            onednn_linear(gp, w.t(), None)[:n] if ctx.needs_input_grad[0] else None
        )  # (N, I) = dY W
        dw = onednn_linear(gp.t(), xp.t(), None) if ctx.needs_input_grad[1] else None  # (O, I)
        db = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


RowView = tuple[np.ndarray, np.ndarray | None]  # W^T (I, O) and b (O,): views, not copies


def make_row_view(m: nn.Linear) -> RowView:
    """Numpy views of ``m``'s weight, transposed, and bias: they share memory with the
    parameters, so an in-place update of the weights shows through them."""
    bias = None if m.bias is None else m.bias.detach().numpy()
    return m.weight.detach().numpy().T, bias


def gemv(x: Tensor, w_t: np.ndarray, b: np.ndarray | None) -> Tensor:
    """(..., I) holding one row, times W^T (I, O) by BLAS's gemv -> (..., O)."""
    out = np.matmul(x.detach().reshape(1, -1).numpy(), w_t)  # (1, O)
    if b is not None:
        np.add(out, b, out=out)
    return torch.from_numpy(out).view(*x.shape[:-1], -1)


def pack_weight(m: nn.Linear, rows: int) -> Tensor:
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows)


def fp32_cpu(x: Tensor) -> bool:
    """An fp32 CPU input outside autocast: the inputs the decoding kernels serve."""
    return (
        x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    )


def plain_fp32(x: Tensor) -> bool:
    """``fp32_cpu`` outside compilation: the eager kernels' domain."""
    return fp32_cpu(x) and not torch.compiler.is_compiling()


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
            out = F.linear(pad_rows(flat), self.weight, self.bias)[:rows]  # (N, O)
        elif self.onednn and rows >= MIN_ROWS and x.dtype == self.weight.dtype == torch.float32:
            out = _OneDNNProducts.apply(flat, self.weight, self.bias)  # (N, O)
        else:
            return F.linear(x, self.weight, self.bias)
        return out.view(*x.shape[:-1], out.shape[-1])  # (..., O)


def cpu_int8_layers(model: nn.Module) -> list[Int8Linear]:
    """The CPU ``Int8Linear`` layers of ``model``."""
    return [
        m for m in model.modules() if isinstance(m, Int8Linear) and m.qweight.device.type == "cpu"
    ]


def cpu_fp32_layers(model: nn.Module) -> list[Linear]:
    """The fp32 CPU ``Linear`` layers of ``model``: those the kernels serve."""
    return [
        m
        for m in model.modules()
        if isinstance(m, Linear)
        and m.weight.device.type == "cpu"
        and m.weight.dtype == torch.float32
    ]


@contextmanager
def swapped(
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
    if not HAS_ONEDNN:
        return 0.0
    gen = torch.Generator().manual_seed(0)  # not the global one: training's RNG stays as is
    x, w = torch.randn(rows, d_in, generator=gen), torch.randn(d_out, d_in, generator=gen)
    g = torch.randn(rows, d_out, generator=gen)

    def mkl() -> None:
        F.linear(x, w)
        g @ w
        g.t() @ x

    def onednn() -> None:
        onednn_linear(x, w, None)
        onednn_linear(g, w.t(), None)
        onednn_linear(g.t(), x.t(), None)

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
    onednn = kernel == "onednn" and HAS_ONEDNN
    with swapped(cpu_fp32_layers(model), TrainingLinear, lambda m: {"onednn": onednn}):
        yield


# -- decoding ---------------------------------------------------------------------------
