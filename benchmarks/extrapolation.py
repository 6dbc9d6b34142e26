"""Length extrapolation (Press et al., 2022): train at one context, evaluate at longer ones.

    python benchmarks/extrapolation.py [--steps 2000] [--contexts 64 128 256]

Trains configs/shakespeare_char.toml (context 64) once per position scheme -- ALiBi, the
paper's sinusoids, RoPE -- with max_len 256 so that every scheme can address the longer
positions, then reports the validation loss (nats per character) at each evaluation context
on the same fixed windows.  Not tuned for any scheme: the config's own settings.  Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from aiayn.checkpoint import load
from aiayn.data.files import data_dir
from aiayn.data.lm_data import TokenStream
from aiayn.device import matmul_gflops
from aiayn.evaluation.perplexity import evaluate_lm
from aiayn.models import DecoderLM
from aiayn.training.config import load_run_config
from aiayn.training.lm import train_lm

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "shakespeare_char.toml"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--schemes", nargs="*", default=["alibi", "sinusoidal", "rope"])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--contexts", nargs="*", type=int, default=[64, 128, 256])
    ap.add_argument("--batches", type=int, default=50, help="evaluation batches per context")
    ap.add_argument(
        "--json", default=str(Path(__file__).resolve().parent / "results" / "extrapolation.json")
    )
    args = ap.parse_args()
    root = data_dir(None)
    rate = matmul_gflops(2048)
    results: dict[str, dict[str, float]] = {}
    print(f"torch.mm fp32: {rate:.0f} GFLOP/s; trained at context 64, {args.steps} steps each")
    print(
        f"{'scheme':<12}"
        + "".join(f"{'ctx ' + str(c):>10}" for c in args.contexts)
        + f"{'train s':>9}"
    )
    for scheme in args.schemes:
        overrides = {
            "model.positions.scheme": scheme,
            "model.max_len": max(args.contexts),
            "train.max_steps": args.steps,
        }
        run = load_run_config(CONFIG, overrides)
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            train_lm(run, out, root, progress=False)
            train_s = time.perf_counter() - t0
            bundle = load(Path(out) / "checkpoint")
        model = bundle.model
        assert isinstance(model, DecoderLM)
        stream = TokenStream.from_file(
            root / run.data.text, bundle.tokenizer, train_fraction=run.data.train_fraction
        )
        row = {}
        for ctx in args.contexts:
            torch.manual_seed(0)
            row[str(ctx)] = evaluate_lm(
                model, stream, batches=args.batches, batch_size=8, block=ctx
            )
        results[scheme] = row | {"train_s": train_s}
        print(
            f"{scheme:<12}"
            + "".join(f"{row[str(c)]:>10.3f}" for c in args.contexts)
            + f"{train_s:>9.0f}",
            flush=True,
        )
    out_path = Path(args.json)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(
        json.dumps({"matmul_fp32_gflops": rate, "steps": args.steps, "results": results}, indent=2)
    )
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
