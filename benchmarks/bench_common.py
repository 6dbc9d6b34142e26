"""What the benchmark scripts share: timing by median, and the machine's matmul rates."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from aiayn.device import timings


def timed(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> tuple[float, list[float]]:
    """Median seconds of ``repeat`` calls after ``warmup`` untimed ones, and every time."""
    times = timings(fn, repeat, warmup)
    return statistics.median(times), times


def median_time(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> float:
    return timed(fn, repeat, warmup)[0]


def matmul_rates(n: int = 2048) -> tuple[float, float]:
    """GFLOP/s of an n³ fp32 product through torch.mm (MKL) and through oneDNN, the two
    denominators of model-FLOPs utilisation on CPU."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    mm = 2 * n**3 / median_time(lambda: a @ b, 5) / 1e9
    onednn = (
        2
        * n**3
        / median_time(lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], ""), 5)
        / 1e9
    )
    return mm, onednn
