"""Generation memory with a sliding window: a rolling KV cache stays flat.

    python benchmarks/window_memory.py [--tokens 32768] [--window 4096] [--json ...]

Generates ``--tokens`` new tokens (batch 1, greedy) from a small Mistral-style decoder
(RoPE, GQA, sliding window) and samples the process's resident memory (RSS) and the cache's
own bytes every 1,024 tokens; then the same model without a window (a growing cache
preallocated to the whole length) for comparison.  Both runs happen in fresh subprocesses so
that their peaks do not mix.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _run(window: int | None, tokens: int, queue: Any) -> None:
    import torch

    import aiayn
    from aiayn.generate import SamplingConfig, stream

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = aiayn.build_model(
        "llama-style-small",
        n_layers=4,
        d_model=256,
        attention={"n_heads": 8, "n_kv_heads": 2, "sliding_window": window},
        ffn={"d_ff": 512},
        vocab_size=1000,
        max_len=tokens + 64,
    ).eval()
    samples: list[dict[str, float]] = []
    t0 = time.perf_counter()
    # stream() owns the cache; measure it through the model's new_cache the same way.
    cache_bytes = model.new_cache(1, tokens + 32).nbytes()
    for i, _ in enumerate(
        stream(model, [[1] * 32], max_new_tokens=tokens, sampling=SamplingConfig(temperature=0))
    ):
        if i % 1024 == 0 or i == tokens - 1:
            samples.append(
                {"token": i + 1, "rss_mib": _rss_mib(), "seconds": time.perf_counter() - t0}
            )
    queue.put({"window": window, "cache_bytes": cache_bytes, "samples": samples})


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument(
        "--json", default=str(Path(__file__).resolve().parent / "results" / "window_memory.json")
    )
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    results = []
    for window in (args.window, None):
        queue = ctx.Queue()
        proc = ctx.Process(target=_run, args=(window, args.tokens, queue))
        proc.start()
        results.append(queue.get())
        proc.join()
    print(f"{'window':>8}{'cache MiB':>11}{'tokens':>9}{'RSS MiB':>9}{'s':>8}")
    for r in results:
        for s in r["samples"][:: max(1, len(r["samples"]) // 8)] + r["samples"][-1:]:
            print(
                f"{r['window'] or 'none':>8}{r['cache_bytes'] / 2**20:>11.1f}{s['token']:>9}{s['rss_mib']:>9.0f}{s['seconds']:>8.1f}"
            )
    rolling = results[0]["samples"]
    growth = rolling[-1]["rss_mib"] - rolling[1]["rss_mib"] if len(rolling) > 1 else float("nan")
    print(
        f"\nrolling cache: RSS grew {growth:.1f} MiB from token {rolling[1]['token']} to {rolling[-1]['token']}"
    )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": results, "rss_growth_mib": growth}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
