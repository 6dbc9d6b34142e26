"""Attention time and peak process memory: reference vs flash vs PyTorch SDPA, in one run.

    python benchmarks/attention.py [--sizes 1024 2048 4096 8192 16384] [--threads 2]
        [--repeat 3] [--json benchmarks/results/attention.json] [--quick]

FlashAttention (Dao et al., 2022) claims memory *linear* in sequence length instead of
quadratic: it never stores the (T, S) attention matrix, only the output and one log-sum-exp
per row, and recomputes the probabilities in the backward pass (Theorem 1: it "requires O(N)
additional memory beyond inputs and output"; the paper reports 10x memory savings at sequence
length 2K and 20x at 4K against exact attention).  This script checks
that claim for our CPU statement of the algorithm (``backend="flash"``, aiayn/nn/flash.py)
against the equation written out (``backend="reference"``, O(T·S) memory) and against the
peer, ``torch.nn.functional.scaled_dot_product_attention``, which dispatches to fused kernels.

Shape: B=1, 8 heads, d_k=64, T = S = n, fp32.  Backends:

* ``reference``, ``flash`` -- ``aiayn.scaled_dot_product_attention(..., backend=...)``.
* ``sdpa`` -- PyTorch SDPA with ``is_causal`` (no mask tensor): the peer.
* ``linear`` -- causal linear attention (Katharopoulos et al., 2020; aiayn/nn/linear_attention.py),
  not exact attention but its O(n) replacement, for the time and memory it saves (causal only).
* ``sdpa+mask`` -- PyTorch SDPA with an explicit boolean ``attn_mask`` tensor, which is what a
  caller must pass for padding or a sliding window: a (T, S) all-True mask for "none", the
  (T, S) causal triangle for "causal", the (T, S) band for "window", and the (B, 1, 1, S)
  key-padding mask for "padding".

Masks: none, causal, a causal sliding window of min(1024, n // 4) keys, and padding (the last
quarter of the keys are padding, non-causal).  Flash gets the window as ``window=`` and the
padding as the same (B, 1, 1, S) mask tensor; reference and sdpa run only none / causal.

Every (backend, n, mask, fwd | fwd+bwd) measurement runs in a fresh subprocess (this script
with the hidden ``--one`` flag), so that peak memory is that measurement's alone.  The child
creates q, k, v (and the upstream gradient), runs one tiny (n=64) call of the same backend so
that thread pools and lazy initialisation are paid, then takes its RSS baseline; explicit mask
tensors are built after the baseline (their memory counts, their construction time does not).
It then times one warm-up and ``--repeat`` calls and reports the median, and its peak RSS
(``getrusage(RUSAGE_SELF).ru_maxrss``): absolute, and the delta over the baseline.

* fwd: inference, q, k, v without grad.
* fwd+bwd: q, k, v require grad; ``out.backward(g)`` with a fixed random g (the gradient of
  a random projection of the output).

A child that dies (out of memory) or exceeds ``--timeout`` is recorded as "OOM/failed".
Reference sizes above ``--max-reference-n`` (fwd, fwd+bwd) are skipped with an estimate of the
memory they need, and so is any reference measurement whose estimate exceeds the memory
available when it would start (rather than push a shared machine into the OOM killer).
The load average is printed and saved: timings on a machine shared with other jobs are noisy
(a 2-thread run on 2 busy cores can stall at every OpenMP barrier).

The summary checks the targets of the issue at the largest n: flash peak memory <= 1.5x
sdpa's and <= 1/10 of reference's (at the largest n where reference ran), flash forward time
<= 2x sdpa's, and flash with a window / padding mask below sdpa+mask in memory.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_common import timed

B, H, D = 1, 8, 64
MASKS = ("none", "causal", "window", "padding", "causal+pad")
BACKENDS = ("reference", "flash", "sdpa", "sdpa+mask", "linear")
MODES = ("fwd", "fwd+bwd")
PEER = {
    "none": "sdpa",
    "causal": "sdpa",
    "window": "sdpa+mask",
    "padding": "sdpa+mask",
    "causal+pad": "sdpa+mask",
}
# Reference backend: peak bytes ≈ COPIES · (B·H·n·n·4), the live (T, S) fp32 matrices at the
# peak (scores, scaled / masked scores, weights), measured at n = 1024 and 2048 (2 threads).
REF_COPIES = {
    ("fwd", False): 2.05,
    ("fwd", True): 3.1,
    ("fwd+bwd", False): 3.1,
    ("fwd+bwd", True): 3.2,
}
PROCESS_GIB = 0.3  # torch, aiayn and the inputs
MiB = 2**20


def window_for(n: int) -> int:
    return min(1024, n // 4)


def backends_for(mask: str, chosen: tuple[str, ...] = BACKENDS) -> tuple[str, ...]:
    """What runs with ``mask``: every exact backend for none / causal, linear attention (not
    exact: another model, aiayn/nn/linear_attention.py) for causal only, and flash and
    sdpa+mask for windows and padding."""
    if mask == "causal":
        kinds: tuple[str, ...] = BACKENDS
    elif mask == "none":
        kinds = BACKENDS[:-1]
    else:
        kinds = ("flash", "sdpa+mask")
    return tuple(b for b in kinds if b in chosen)


def reference_gib(n: int, mode: str, mask: str) -> float:
    return REF_COPIES[(mode, mask == "causal")] * B * H * n * n * 4 / 2**30 + PROCESS_GIB


def available_gib() -> float:
    """MemAvailable from /proc/meminfo (inf where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


# ---------------------------------------------------------------------------- child process


def _rss_now() -> float:
    """Current resident set size, MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def _rss_peak() -> float:
    """Peak resident set size of this process so far, MiB (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _make_call(backend: str, mask: str, n: int) -> Callable[..., Any]:
    """The attention call for one measurement; explicit mask tensors are allocated here."""
    import torch
    import torch.nn.functional as F

    import aiayn
    from aiayn.nn.masks import causal_mask, sliding_window_mask

    window = window_for(n) if mask == "window" else None
    keep: torch.Tensor | None = None
    if mask in ("padding", "causal+pad"):  # (B, 1, 1, S): the last quarter of keys is padding
        keep = torch.ones(B, 1, 1, n, dtype=torch.bool)
        keep[..., n - n // 4 :] = False
    if backend == "linear":
        from aiayn.nn.linear_attention import linear_attention

        return lambda q, k, v: linear_attention(q, k, v)[0]
    if backend in ("reference", "flash"):

        def ours(q: Any, k: Any, v: Any) -> Any:
            return aiayn.scaled_dot_product_attention(
                q,
                k,
                v,
                keep,
                is_causal=mask in ("causal", "causal+pad"),
                window=window,
                backend=backend,
            )

        return ours
    if backend == "sdpa":
        assert mask in ("none", "causal")
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal")
    attn = {
        "none": lambda: torch.ones(n, n, dtype=torch.bool),
        "causal": lambda: causal_mask(n),
        "window": lambda: sliding_window_mask(n, window=window or 1),
        "padding": lambda: keep,
        # A batched decoder (padding + causality) must hand SDPA the combined (B, 1, T, S) mask.
        "causal+pad": lambda: causal_mask(n) & keep,
    }[mask]()
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=attn)


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement, in this (fresh) process."""
    import torch

    import aiayn  # noqa: F401  (registers the "flash" backend)

    torch.set_num_threads(spec["threads"])
    n, backend, mask, mode = spec["n"], spec["backend"], spec["mask"], spec["mode"]
    grad = mode == "fwd+bwd"

    def inputs(size: int) -> tuple[Any, ...]:
        q, k, v = (torch.randn(B, H, size, D, requires_grad=grad) for _ in range(3))
        return q, k, v, torch.randn(B, H, size, D)

    def step_of(call: Callable[..., Any], q: Any, k: Any, v: Any, g: Any) -> Callable[[], None]:
        def step() -> None:
            if grad:
                call(q, k, v).backward(g)
                q.grad = k.grad = v.grad = None
            else:
                with torch.no_grad():
                    call(q, k, v)

        return step

    torch.manual_seed(0)
    q, k, v, g = inputs(n)
    step_of(_make_call(backend, mask, 64), *inputs(64))()  # pay one-time initialisation
    gc.collect()
    base, base_peak = _rss_now(), _rss_peak()
    step = step_of(_make_call(backend, mask, n), q, k, v, g)
    median, times = timed(step, spec["repeat"], warmup=1)
    peak = max(_rss_peak(), _rss_now())  # ru_maxrss can lag the current RSS slightly
    return {
        **spec,
        "status": "ok",
        "ms": median * 1e3,
        "times_ms": [t * 1e3 for t in times],
        "baseline_rss_mib": base,
        "baseline_peak_rss_mib": base_peak,
        "peak_rss_mib": peak,
        "peak_delta_mib": peak - base,
    }


# --------------------------------------------------------------------------- parent process


def measure(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``spec`` in a fresh interpreter; never raises."""
    t0 = time.perf_counter()
    cmd = [sys.executable, os.path.abspath(__file__), "--one", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**spec, "status": "OOM/failed", "error": f"timeout after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or [""])[-1][-300:]
        return {
            **spec,
            "status": "OOM/failed",
            "returncode": proc.returncode,
            "error": err or f"exit code {proc.returncode}",
            "wall_s": wall,
        }
    return {**json.loads(lines[-1][len("RESULT ") :]), "wall_s": wall}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


Results = dict[tuple[int, str, str, str], dict[str, Any]]


def ok(r: dict[str, Any] | None) -> bool:
    return r is not None and r.get("status") == "ok"


def cell(r: dict[str, Any] | None, key: str, width: int, fmt: str) -> str:
    if r is None:
        return f"{'':>{width}}"
    if r["status"] != "ok":
        return f"{'skipped' if r['status'] == 'skipped' else 'failed':>{width}}"
    return f"{format(r[key], fmt):>{width}}"


def ratio(r: dict[str, Any] | None, peer: dict[str, Any] | None, key: str) -> str:
    if not (ok(r) and ok(peer)):
        return f"{'':>7}"
    assert r is not None and peer is not None
    return f"{r[key] / max(peer[key], 1e-9):>6.2f}x"


def mem_cell(r: dict[str, Any] | None) -> str:
    if not ok(r):
        return cell(r, "", 14, "")
    assert r is not None
    return f"{r['peak_delta_mib']:>7.0f} ({r['peak_rss_mib']:>4.0f})"


def print_table(res: Results, sizes: list[int]) -> None:
    print(
        f"\n{'n':>6} {'mask':<12}{'backend':<11}{'fwd ms':>9}{'×peer':>7}{'f+b ms':>10}{'×peer':>7}"
        f"{'fwd MiB Δ (peak)':>17}{'×peer':>7}{'f+b MiB Δ (peak)':>17}{'×peer':>7}"
    )
    for n in sizes:
        for mask in MASKS:
            label = f"window={window_for(n)}" if mask == "window" else mask
            for backend in backends_for(mask):
                f, fb = res.get((n, mask, backend, "fwd")), res.get((n, mask, backend, "fwd+bwd"))
                if f is None and fb is None:  # not asked for (--masks, --backends)
                    continue
                pf, pfb = (
                    res.get((n, mask, PEER[mask], "fwd")),
                    res.get((n, mask, PEER[mask], "fwd+bwd")),
                )
                print(
                    f"{n:>6} {label:<12}{backend:<11}{cell(f, 'ms', 9, '.1f')}{ratio(f, pf, 'ms')}"
                    f"{cell(fb, 'ms', 10, '.1f')}{ratio(fb, pfb, 'ms')}"
                    f"  {mem_cell(f)}{ratio(f, pf, 'peak_delta_mib')}"
                    f"  {mem_cell(fb)}{ratio(fb, pfb, 'peak_delta_mib')}"
                )
    print(
        "×peer: against sdpa (is_causal, no mask tensor) for none / causal rows, against "
        "sdpa+mask for window / padding rows.\nMiB Δ: peak RSS over the child's baseline "
        "(after imports, inputs and a tiny call); (peak): absolute peak RSS."
    )


def check(name: str, value: float | None, limit: float, how: str) -> dict[str, Any]:
    passed = None if value is None else (value <= limit if how == "<=" else value < limit)
    verdict = {None: "n/a ", True: "PASS", False: "FAIL"}[passed]
    shown = "not measured" if value is None else f"{value:.2f}x"
    print(f"  {verdict}  {name}: {shown} (target {how} {limit:g}x)")
    return {"name": name, "value": value, "limit": limit, "passed": passed}


def summary(res: Results, sizes: list[int]) -> list[dict[str, Any]]:
    def rel(n: int, mask: str, a: str, b: str, mode: str, key: str) -> float | None:
        x, y = res.get((n, mask, a, mode)), res.get((n, mask, b, mode))
        if not (ok(x) and ok(y)):
            return None
        assert x is not None and y is not None
        return float(x[key] / max(y[key], 1e-9))

    def largest(mask: str, a: str, b: str, mode: str) -> int:
        both = [
            n for n in sizes if ok(res.get((n, mask, a, mode))) and ok(res.get((n, mask, b, mode)))
        ]
        return max(both) if both else sizes[-1]

    n = sizes[-1]
    print(f"\nTargets at n={n} (memory = peak RSS delta; ratios flash / peer):")
    out = []
    for mask in ("none", "causal"):
        for mode in MODES:
            out.append(
                check(
                    f"{mask:<8}{mode:<8}memory vs sdpa",
                    rel(n, mask, "flash", "sdpa", mode, "peak_delta_mib"),
                    1.5,
                    "<=",
                )
            )
    for mask in ("none", "causal"):
        for mode in MODES:
            m = largest(mask, "flash", "reference", mode)
            out.append(
                check(
                    f"{mask:<8}{mode:<8}memory vs reference (n={m})",
                    rel(m, mask, "flash", "reference", mode, "peak_delta_mib"),
                    0.1,
                    "<=",
                )
            )
    for mask in ("none", "causal"):
        out.append(
            check(
                f"{mask:<8}fwd     time vs sdpa",
                rel(n, mask, "flash", "sdpa", "fwd", "ms"),
                2.0,
                "<=",
            )
        )
    for mask in ("window", "padding", "causal+pad"):
        for mode in MODES:
            out.append(
                check(
                    f"{mask:<8}{mode:<8}memory vs sdpa+mask",
                    rel(n, mask, "flash", "sdpa+mask", mode, "peak_delta_mib"),
                    1.0,
                    "<",
                )
            )
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--masks", nargs="+", default=list(MASKS), choices=MASKS, help="mask kinds to run"
    )
    ap.add_argument(
        "--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS, help="backends to run"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--json", default=str(Path(__file__).resolve().parent / "results" / "attention.json")
    )
    ap.add_argument("--quick", action="store_true", help="sizes 256 512 1024, repeat 1")
    ap.add_argument(
        "--max-reference-n",
        type=int,
        nargs="+",
        default=[16384, 8192],
        metavar="N",
        help="largest n for the reference backend: fwd [fwd+bwd] (default 16384 8192)",
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    return ap


def main() -> int:
    args = _parser().parse_args()
    if args.one:
        print("RESULT " + json.dumps(run_one(json.loads(args.one))), flush=True)
        return 0
    if args.quick:
        args.sizes, args.repeat = [256, 512, 1024], 1
    sizes = sorted(args.sizes)
    max_ref = dict(zip(MODES, [*args.max_reference_n, args.max_reference_n[-1]], strict=False))

    import torch
    from rounds import host_rates, rates_line

    rates = host_rates()  # beside every figure: this host's matmul rates, measured now
    print(rates_line(rates), flush=True)
    meta: dict[str, Any] = {
        "host": rates,
        "torch": torch.__version__,
        "threads": args.threads,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "shape": {"B": B, "H": H, "d_k": D, "dtype": "float32"},
        "repeat": args.repeat,
        "sizes": sizes,
        "max_reference_n": max_ref,
        "loadavg_start": os.getloadavg(),
        "mem_available_gib_start": available_gib(),
    }
    print(
        f"attention B={B} H={H} d_k={D} fp32, {args.threads} threads, median of {args.repeat}, "
        f"torch {meta['torch']}, {meta['cpu']} ({meta['cores']} cores), "
        f"load average {meta['loadavg_start'][0]:.2f}, {meta['mem_available_gib_start']:.1f} GiB available\n"
    )
    if meta["loadavg_start"][0] + args.threads > (meta["cores"] or 1) + 0.5:
        print(
            f"warning: load average {meta['loadavg_start'][0]:.2f} on {meta['cores']} cores: "
            "other jobs share the CPUs, so backends that issue many small ops (flash) can "
            "stall at every OpenMP barrier; timings will be noisy (memory is unaffected)\n"
        )
    out_path = Path(args.json)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    res: Results = {}
    start = time.perf_counter()
    for n in sizes:
        for mask in args.masks:
            for backend in backends_for(mask, tuple(args.backends)):
                for mode in MODES:
                    spec = {
                        "n": n,
                        "mask": mask,
                        "backend": backend,
                        "mode": mode,
                        "threads": args.threads,
                        "repeat": args.repeat,
                    }
                    tag = f"n={n:<6} {mask:<8}{backend:<10}{mode:<8}"
                    need = reference_gib(n, mode, mask) if backend == "reference" else 0.0
                    if backend == "reference" and (n > max_ref[mode] or need > available_gib()):
                        why = (
                            "--max-reference-n"
                            if n > max_ref[mode]
                            else f"{available_gib():.1f} GiB available"
                        )
                        r = {**spec, "status": "skipped", "needs_gib": need, "reason": why}
                        print(f"{tag} skipped (needs ~{need:.1f} GiB; {why})", flush=True)
                    else:
                        r = measure(spec, args.timeout)
                        if ok(r):
                            print(
                                f"{tag} {r['ms']:>10.1f} ms  Δ{r['peak_delta_mib']:>7.0f} MiB  peak {r['peak_rss_mib']:>6.0f} MiB  ({r['wall_s']:.1f} s)",
                                flush=True,
                            )
                        else:
                            print(f"{tag} OOM/failed: {r.get('error', '')}", flush=True)
                    res[(n, mask, backend, mode)] = r
        meta["elapsed_s"] = time.perf_counter() - start
        out_path.write_text(json.dumps({**meta, "results": list(res.values())}, indent=2))
    print_table(res, sizes)
    targets = summary(res, sizes)
    meta["elapsed_s"] = time.perf_counter() - start
    meta["loadavg_end"] = os.getloadavg()
    out_path.write_text(
        json.dumps({**meta, "targets": targets, "results": list(res.values())}, indent=2)
    )
    print(f"\n{meta['elapsed_s']:.0f} s; wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
