"""Where a model runs and in what precision, and what the machine can do.

* ``resolve_device`` -- ``"auto"`` (CUDA when available, else the CPU), ``"cpu"``,
  ``"cuda"`` or ``"cuda:N"``; asking for a GPU that is not there is an error that says why.
* ``resolve_dtype`` -- ``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"``.  On a GPU
  ``"auto"`` is bf16 where the GPU has it; on a CPU it is bf16 only where the processor
  multiplies bf16 natively (AVX-512 BF16 or AMX, read from the CPU's own feature flags) *and*
  a bf16 product measures faster than fp32 here; otherwise fp32.
* ``matmul_gflops`` -- the rate of a plain matrix product measured now.  Shared machines
  drift about 2x in speed from hour to hour, so every timing aiayn prints comes with this rate
  measured in the same process: a figure reads as a ratio to the machine, not an absolute.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from aiayn.errors import ConfigError

ModuleT = TypeVar("ModuleT", bound=nn.Module)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def timings(fn: Callable[[], object], repeat: int, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeat`` calls of ``fn()``, after ``warmup`` untimed ones (kernels
    are built on first use)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def best_seconds(fn: Callable[[], object], repeat: int = 3) -> float:
    """The shortest of ``repeat`` timings after one warm-up: how aiayn times the alternatives
    of a choice it makes at run time."""
    return min(timings(fn, repeat))


def matmul_gflops(
    n: int = 1024, dtype: torch.dtype = torch.float32, repeat: int = 5, device: str = "cpu"
) -> float:
    """GFLOP/s of an n³ ``torch.mm`` (median of ``repeat`` after one warm-up)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a @ b
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        sync()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


@cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags Linux reports (empty elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bf16 natively (AVX-512 BF16 or AMX on x86, BF16 on Arm);
    without it bf16 arithmetic is emulated and slower than fp32."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


@cache
def bf16_speedup(n: int = 1024) -> float:
    """How much faster a bf16 n³ product runs than an fp32 one on this CPU, measured once."""
    return matmul_gflops(n, torch.bfloat16, repeat=3) / matmul_gflops(n, torch.float32, repeat=3)


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The device ``spec`` names; ``"auto"`` is the first GPU when there is one."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as err:
        raise ConfigError(
            f"device {spec!r} is invalid: expected auto, cpu, cuda or cuda:N ({err})"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build of torch" if torch.version.cuda is None else "no usable GPU"
            raise ConfigError(
                f"device {spec!r} was asked for, but CUDA is not available here ({build});"
                " use --device cpu, or install the CUDA build of torch (README: Training on GPUs)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {spec!r} does not exist: this machine has"
                f" {torch.cuda.device_count()} GPU(s), cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    elif device.type != "cpu":
        raise ConfigError(f"device {spec!r} is not supported: expected auto, cpu, cuda or cuda:N")
    return device


def inference_dtype(device: torch.device) -> torch.dtype:
    """What generation and beam search run in: bf16 on a GPU that has it, else fp32 (the CPU's
    decoding step is bound by reading fp32 weights through BLAS, aiayn/nn/cpu_kernels.py)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def for_inference(model: ModuleT, device: torch.device) -> ModuleT:
    """``model`` on ``device`` in ``inference_dtype``, in evaluation mode: what every
    command that decodes or scores does with a loaded checkpoint."""
    model.to(device, inference_dtype(device))
    return model.eval()


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """The compute dtype ``spec`` names on ``device`` (see the module docstring for auto)."""
    if spec in DTYPES:
        return DTYPES[spec]
    if spec != "auto":
        raise ConfigError(f"dtype {spec!r} is invalid: expected one of auto, {', '.join(DTYPES)}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_bf16() and bf16_speedup() > 1.3 else torch.float32
