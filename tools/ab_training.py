"""Training speed of two source trees of aiayn, interleaved in rounds, each run in a fresh
process (a check that a change did not make training slower; not a product benchmark).

    python tools/ab_training.py BEFORE_TREE AFTER_TREE [--rounds 3] [--data DIR] [--only demo]

Each run is ``python -m aiayn train`` on a config of the AFTER tree for a fixed number of
steps with the tree on PYTHONPATH, and reads the target tokens/s that the run prints (measured by the
loop over its steps, the final evaluation included; setup and tokenizer training excluded).
Rounds alternate which tree goes first.  Prints the median and the min-max per tree and the
after/before ratio of the medians, with the host's fp32 matmul rate before and after.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ab_rounds import alternate, row

# name -> (config in the AFTER tree, used by both trees so that both train the same model;
# overrides)
CASES = {
    "shakespeare_char (LM, 400 steps)": (
        "configs/shakespeare_char.toml",
        ["train.max_steps=400", "train.eval_interval=400", "train.checkpoint_interval=400"],
    ),
    "demo_de_en (translation, 80 steps)": (
        "configs/demo_de_en.toml",
        ["train.max_steps=80", "train.eval_interval=80", "train.checkpoint_interval=80"],
    ),
}


def run(tree: str, config: str, overrides: list[str], data: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "aiayn", "train", config, "--out", out, "--data", data, "--set", *overrides]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": tree}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=out)
    found = re.search(r"([\d,]+) target tokens/s", done.stdout)
    if found is None:
        raise RuntimeError(f"no tokens/s in the output of {tree}:\n{done.stdout[-2000:]}")
    return float(found.group(1).replace(",", ""))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", default=os.environ.get("AIAYN_DATA", "../shared/data"))
    ap.add_argument("--only", help="run only the cases whose name contains this text")
    args = ap.parse_args()
    before, after = str(Path(args.before).resolve()), str(Path(args.after).resolve())
    data = str(Path(args.data).resolve())
    sys.path.insert(0, after)
    from aiayn.device import matmul_gflops

    print(f"torch.mm fp32 {matmul_gflops(2048):.0f} GFLOP/s, {args.rounds} rounds")
    print(f"{'case':<36}{'before tok/s':>24}{'after tok/s':>24}{'after/before':>14}")
    for name, (config, overrides) in CASES.items():
        if args.only and args.only not in name:
            continue

        def measure(which: str, config: str = config, overrides: list[str] = overrides) -> float:
            tree = before if which == "before" else after
            return run(tree, str(Path(after) / config), overrides, data)

        got = alternate(measure, args.rounds)
        print(row(name, got, 36), flush=True)
    print(f"torch.mm fp32 after: {matmul_gflops(2048):.0f} GFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
