"""What the machine can do: measured matrix-multiply rates and the CPU's bf16 support.

Shared machines drift about 2x in speed from hour to hour, so every timing aiayn prints is
accompanied by the rate of a plain matrix product measured in the same process: a figure can
then be read as a ratio to the machine, not as an absolute.
"""

from __future__ import annotations

import statistics
import time
from functools import cache
from pathlib import Path

import torch


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
