"""Generation speed of two source trees of aiayn, interleaved in rounds, each run in a fresh
process (a check that a change did not make decoding slower; not a product benchmark).

    python tools/ab_generation.py BEFORE_TREE AFTER_TREE [--rounds 5] [--threads 2]

Each run builds the same seeded model, generates 256 tokens greedily after a 32-token prompt,
and reports tokens/s.  Rounds alternate which tree goes first.  Prints the median and the
min-max per tree and the after/before ratio of the medians, with the host's fp32 matmul rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ab_rounds import alternate, row

CHILD = r"""
import json, sys, time, torch
torch.set_num_threads({threads})
import aiayn
from aiayn.generate import SamplingConfig, generate
shape = {shape}
torch.manual_seed(0)
model = aiayn.build_model("gpt2-small", n_layers=shape["L"], n_heads=shape["H"], d_model=shape["C"],
    d_ff=4 * shape["C"], vocab_size=shape["V"], max_len=320, dropout=0.0).eval()
prompt = torch.randint(0, shape["V"], ({batch}, 32)).tolist()
greedy = SamplingConfig(temperature=0)
generate(model, prompt, max_new_tokens=16, sampling=greedy)  # warm-up
t0 = time.perf_counter()
generate(model, prompt, max_new_tokens=256, sampling=greedy)
print(json.dumps({{"tok_s": {batch} * 256 / (time.perf_counter() - t0)}}))
"""

SHAPES = {
    "6L-384": {"L": 6, "H": 6, "C": 384, "V": 65},
    "gpt2-small": {"L": 12, "H": 12, "C": 768, "V": 50257},
}


def run(tree: str, shape: dict[str, int], batch: int, threads: int) -> float:
    code = CHILD.format(shape=shape, batch=batch, threads=threads)
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["tok_s"])


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    args = ap.parse_args()
    sys.path.insert(0, args.after)
    from aiayn.device import matmul_gflops

    print(
        f"torch.mm fp32 {matmul_gflops(2048):.0f} GFLOP/s, {args.threads} threads, {args.rounds} rounds"
    )
    print(f"{'shape / batch':<18}{'before tok/s':>24}{'after tok/s':>24}{'after/before':>14}")
    for name, shape in SHAPES.items():
        for batch in args.batches:

            def measure(which: str, shape: dict[str, int] = shape, batch: int = batch) -> float:
                return run(getattr(args, which), shape, batch, args.threads)

            got = alternate(measure, args.rounds)
            print(row(f"{name} b{batch}", got, 18), flush=True)
    print(f"matmul after: {matmul_gflops(2048):.0f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
