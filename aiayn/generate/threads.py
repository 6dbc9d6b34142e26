"""How many threads a decoding step should run on: all the cores, or one when the step is small.

A decoding step does a fixed amount of work: every weight is read once and multiplied by each
of its rows.  Spread over threads, a large step finishes sooner; a small one does not, because
each of its ~50 products then pays for waking and joining the other threads, and that cost does
not shrink with the product.  On a 2-core Xeon Ice Lake both aiayn and CTranslate2 decoded a
Marian-small sentence at batch 1 (beam 4) faster on one thread than on two.

``--threads auto`` therefore counts the step's multiply-adds -- rows times the weights of the
model's linear layers -- and gives a step below ``SMALL_STEP`` one thread, any other step
every core it may use.  The threshold comes from ``benchmarks/decoding.py``, which decodes a
small and a GPT-2-small model at batch 1 and 8 on one and on two threads and prints the thread
count this rule picks beside the faster one (docs/performance.md, "Threads by shape").
"""

from __future__ import annotations

import os

from torch import nn

from aiayn.errors import UserError
from aiayn.nn.linear import Linear
from aiayn.nn.quantized import Int8Linear

SMALL_STEP = 32_000_000  # multiply-adds per step below which one thread decodes faster


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def step_macs(model: nn.Module, rows: int) -> int:
    """Multiply-adds of the linear layers in one decoding step of ``rows`` rows: the decoder's
    and the output projection's (an encoder runs once per sentence, not per step)."""
    parts = [getattr(model, "decoder", model), getattr(model, "head", None)]
    layers = {
        id(m): m
        for part in parts
        if isinstance(part, nn.Module)
        for m in part.modules()
        if isinstance(m, Linear | Int8Linear)
    }
    return rows * sum(m.in_features * m.out_features for m in layers.values())


def decode_threads(
    setting: str | int, model: nn.Module, rows: int, cores: int | None = None
) -> int:
    """The thread count for decoding ``rows`` rows per step of ``model``: ``setting`` when it
    is a number, else (``"auto"``) one thread for a step below ``SMALL_STEP``
    multiply-adds and ``cores`` (default: ``available_cores``) for any other."""
    if isinstance(setting, int) or (isinstance(setting, str) and setting.isdigit()):
        threads = int(setting)
        if threads < 1:
            raise UserError(f"threads={setting!r} is invalid: expected 'auto' or a count >= 1")
        return threads
    if setting != "auto":
        raise UserError(f"threads={setting!r} is invalid: expected 'auto' or a count >= 1")
    cores = available_cores() if cores is None else cores
    return 1 if step_macs(model, rows) < SMALL_STEP else max(1, cores)
