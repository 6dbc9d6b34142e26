"""Benchmarks that cannot flatter: every measurement in a fresh process, the implementations
interleaved round by round, the median reported with the min-max.

A benchmark script defines its cases (each a JSON-able dict of arguments) and a ``measure``
function that runs one case and returns numbers.  :func:`interleaved` runs the script again
as a child (``--child CASE_JSON``) once per case per round, rotating which case goes first,
so that a host whose speed drifts during the run (shared machines drift about 2x from hour
to hour) drifts for everyone alike, and no case inherits another's warm caches, allocator
state or thread pools.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

CHILD_FLAG = "--child"


def child_main(measure: Callable[[dict[str, Any]], dict[str, float]]) -> bool:
    """When this process is a child, run its one case, print the result as JSON, return True."""
    if CHILD_FLAG not in sys.argv:
        return False
    case = json.loads(sys.argv[sys.argv.index(CHILD_FLAG) + 1])
    torch.set_num_threads(int(case.get("threads", torch.get_num_threads())))
    print(json.dumps(measure(case)), flush=True)
    return True


def interleaved(
    script: str | Path,
    cases: Sequence[dict[str, Any]],
    rounds: int,
    *,
    label: str = "name",
    timeout_s: float = 600.0,
) -> dict[str, list[dict[str, float]]]:
    """Run every case ``rounds`` times, each in a fresh process, rotating the order per round.
    Returns each case's results (keyed by ``case[label]``) in round order.  A case whose child
    fails is reported with its error and left out."""
    out: dict[str, list[dict[str, float]]] = {str(c[label]): [] for c in cases}
    for r in range(rounds):
        k = r % len(cases)
        for case in [*cases[k:], *cases[:k]]:
            # Every thread pool a child may use gets the same size: torch's, and the BLAS
            # pools that numpy (aiayn's one-row products) and MKL/OpenMP start on their own.
            t = str(case.get("threads", torch.get_num_threads()))
            env = {
                **os.environ,
                "OMP_NUM_THREADS": t,
                "OPENBLAS_NUM_THREADS": t,
                "MKL_NUM_THREADS": t,
            }
            try:
                done = subprocess.run(
                    [sys.executable, str(script), CHILD_FLAG, json.dumps(case)],
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=timeout_s,
                )
            except subprocess.TimeoutExpired:
                print(f"  {case[label]}: no result within {timeout_s} s, left out")
                continue
            if done.returncode != 0:
                last = "\n".join(done.stderr.strip().splitlines()[-3:])
                print(f"  {case[label]}: failed, left out:\n{last}")
                continue
            out[str(case[label])].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of one metric over the rounds, and how many rounds gave one."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def cell(s: dict[str, float], fmt: str = ".0f") -> str:
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def host_rates(n: int = 2048) -> dict[str, float]:
    """The rates a reader needs beside any figure: torch.mm in fp32 and bf16, and oneDNN's fp32
    rate over MKL's (the host-dependent training speed-up of aiayn/nn/cpu_kernels.py).
    ``best_fp32_gflops`` -- the faster of the two fp32 paths -- is the MFU denominator in fp32,
    so that a model on oneDNN is not credited with oneDNN's advantage over MKL."""
    from bench_common import matmul_rates, median_time

    mm, onednn = matmul_rates(n)
    a, b = torch.randn(n, n).bfloat16(), torch.randn(n, n).bfloat16()
    bf16 = 2 * n**3 / median_time(lambda: a @ b, 5) / 1e9
    return {
        "mm_fp32_gflops": mm,
        "best_fp32_gflops": max(mm, onednn),
        "mm_bf16_gflops": bf16,
        "onednn_over_mkl": onednn / mm,
    }


def rates_line(r: dict[str, float]) -> str:
    return (
        f"torch.mm fp32 {r['mm_fp32_gflops']:.0f} GFLOP/s, bf16 {r['mm_bf16_gflops']:.0f} GFLOP/s;"
        f" oneDNN/MKL fp32 {r['onednn_over_mkl']:.2f}x"
    )
