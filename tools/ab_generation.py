"""Decoding speed of two source trees of aiayn, interleaved in rounds, each run in a fresh
process (a check that a change did not make decoding slower or change its output; not a
product benchmark).

    python tools/ab_generation.py BEFORE_TREE AFTER_TREE [--rounds 5] [--threads 2] [--only beam]

Each run builds the same seeded model and decodes: a decoder-only model generates 256 tokens
greedily after a 32-token prompt (tokens/s), and a Marian-small-shape encoder-decoder (6+6
layers, width 512, 8,000 words) runs beam 4 (alpha 0.6) over 16-token sources for exactly 40
tokens, EOS forbidden (sentences/s).  Rounds alternate which tree goes first.  Prints the
median and the min-max per tree and the after/before ratio of the medians, with the host's
fp32 matmul rate, and whether both trees produced the same token ids.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from ab_rounds import alternate, row

GREEDY = r"""
import hashlib, json, sys, time, torch
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
out = generate(model, prompt, max_new_tokens=256, sampling=greedy)
rate = {batch} * 256 / (time.perf_counter() - t0)
print(json.dumps({{"rate": rate, "ids": hashlib.sha256(repr(out).encode()).hexdigest()}}))
"""

BEAM = r"""
import hashlib, json, sys, time, torch
torch.set_num_threads({threads})
import aiayn
from aiayn.generate.beam import BeamConfig, beam_search
torch.manual_seed(0)
model = aiayn.build_model("paper-base", n_layers=6, d_model=512, n_heads=8, d_ff=2048,
    vocab_size=8000, max_len=256, dropout=0.0).eval()
src = torch.randint(3, 8000, ({batch}, 16), generator=torch.Generator().manual_seed(1))
beam = BeamConfig(beam_size=4, length_penalty=0.6, max_extra=24)  # 16 + 24 = 40 tokens
beam_search(model, src[:1, :8], bos=1, eos=2, config=beam, never=(2,))  # warm-up
t0 = time.perf_counter()
out = beam_search(model, src, bos=1, eos=2, config=beam, never=(2,))
rate = {batch} / (time.perf_counter() - t0)
print(json.dumps({{"rate": rate, "ids": hashlib.sha256(repr(out).encode()).hexdigest()}}))
"""

# name -> (child program, shape, batches, unit)
CASES = {
    "6L-384 greedy": (GREEDY, {"L": 6, "H": 6, "C": 384, "V": 65}, (1, 8), "tok/s"),
    "gpt2-small greedy": (GREEDY, {"L": 12, "H": 12, "C": 768, "V": 50257}, (1, 8), "tok/s"),
    "marian-small beam 4": (BEAM, {}, (1, 64), "sent/s"),
}


def run(tree: str, code: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return float(got["rate"]), str(got["ids"])


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", help="run only the cases whose name contains this text")
    args = ap.parse_args()
    sys.path.insert(0, args.after)
    from aiayn.device import matmul_gflops

    print(
        f"torch.mm fp32 {matmul_gflops(2048):.0f} GFLOP/s, {args.threads} threads, {args.rounds} rounds"
    )
    print(f"{'case / batch':<26}{'before':>24}{'after':>24}{'after/before':>14}  same ids")
    for name, (child, shape, batches, unit) in CASES.items():
        if args.only and args.only not in name:
            continue
        for batch in batches:
            code = child.format(shape=shape, batch=batch, threads=args.threads)
            ids: dict[str, set[str]] = {"before": set(), "after": set()}

            def measure(which: str, code: str = code, ids: dict[str, set[str]] = ids) -> float:
                rate, digest = run(getattr(args, which), code)
                ids[which].add(digest)
                return rate

            got = alternate(measure, args.rounds)
            same = len(ids["before"] | ids["after"]) == 1
            print(row(f"{name} b{batch} ({unit})", got, 26) + f"  {same}", flush=True)
    print(f"matmul after: {matmul_gflops(2048):.0f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
