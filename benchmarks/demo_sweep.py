"""The demo's recipe, searched: which settings reach the best validation BLEU for a fixed
amount of training compute on Multi30k de->en?

    python benchmarks/demo_sweep.py [--trials NAME ...] [--out runs/demo_sweep]

Each trial is configs/demo_de_en.toml with some settings changed, trained from scratch in a
fresh process for a fixed number of steps (never a time budget), then scored on the first
500 validation sentences (beam 4; the test set is left for the final figure).  The table
gives each trial's training FLOPs (6 x matrix parameters x padded tokens, both sides, plus
the attention scores), its validation loss and BLEU, the wall time and peak memory, with the
host's fp32 matmul rate measured in the same run.  Writes JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiayn.checkpoint import load_bundle
from aiayn.data.batching import token_batches
from aiayn.data.files import data_dir
from aiayn.inspect.machine import matmul_gflops
from aiayn.train.config import load_run_config
from aiayn.train.translate import encode_pairs, load_pairs

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo_de_en.toml"

# name -> overrides of configs/demo_de_en.toml.  Every trial costs about the same compute:
# halving the tokens per batch doubles the steps.  The schedule is Eq. (3); a trial is named by
# the peak learning rate it reaches at the end of warm-up, d_model^-0.5 · warmup^-0.5 · lr.


def _paper(peak: float, warmup: int, d_model: int = 256) -> list[str]:
    return [f"train.warmup_steps={warmup}", f"train.lr={peak * (d_model * warmup) ** 0.5:.4f}"]


TRIALS: dict[str, list[str]] = {
    "w800-f1": ["train.warmup_steps=800", "train.lr=1.0"],  # the old demo's schedule
    "w100-f1": ["train.warmup_steps=100", "train.lr=1.0"],  # peak 6.3e-3
    "peak1.5e-3": _paper(1.5e-3, 80),
    "peak2.5e-3": _paper(2.5e-3, 80),
    "peak4e-3": _paper(4e-3, 80),
}


def training_flops(checkpoint: Path, root: Path, overrides: list[str]) -> dict[str, float]:
    """FLOPs of the run's training: per padded token 6 x (matrix parameters it meets), plus
    attention scores, summed over the batches it trained on."""
    from aiayn.cli import _overrides
    from aiayn.inspect.calc import parameter_breakdown

    run = load_run_config(CONFIG, _overrides(overrides))
    bundle = load_bundle(checkpoint)
    c = bundle.model.config
    pairs = encode_pairs(load_pairs(run, root, "train"), bundle.tokenizer)  # type: ignore[arg-type]
    lengths = [(len(s), len(t) - 1) for s, t in pairs]
    d = c.d_model
    attn, ffn = 4 * d * d, 2 * d * c.d_ff
    enc_layer, dec_layer, head = attn + ffn, 2 * attn + ffn, d * c.vocab_size
    src_tokens = tgt_tokens = score = 0.0
    steps, epoch = run.train.max_steps, 0
    seen = 0
    while seen < steps:
        for b in token_batches(
            lengths, run.train.max_tokens or 4096, seed=run.train.seed, epoch=epoch
        ):
            if seen == steps:
                break
            n, s, t = len(b), max(lengths[i][0] for i in b), max(lengths[i][1] for i in b)
            src_tokens, tgt_tokens = src_tokens + n * s, tgt_tokens + n * t
            # QK^T and AV: encoder S^2, decoder T^2 (full, as SDPA computes it) and T*S cross
            score += n * 2 * 2 * d * (c.n_layers * s * s + c.decoder_layers * (t * t + t * s))
            seen += 1
        epoch += 1
    flops = 3 * (
        2
        * (c.n_layers * enc_layer * src_tokens + (c.decoder_layers * dec_layer + head) * tgt_tokens)
        + score
    )
    del parameter_breakdown
    return {"flops": flops, "src_tokens": src_tokens, "tgt_tokens": tgt_tokens}


def run_trial(name: str, overrides: list[str], out: Path, root: Path) -> dict[str, Any]:
    folder = out / name
    cmd = [sys.executable, "-m", "aiayn", "train", str(CONFIG), "--out", str(folder), "--data", str(root), "--overwrite", "--set", *overrides]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    train_s = time.perf_counter() - t0
    last = done.stdout.strip().splitlines()[-1]
    val_loss = float(re.search(r"validation loss ([\d.]+)", last).group(1))  # type: ignore[union-attr]
    peak = float(re.search(r"peak memory ([\d,]+) MiB", last).group(1).replace(",", ""))  # type: ignore[union-attr]
    ev = [sys.executable, "-m", "aiayn", "evaluate", "--checkpoint", str(folder / "checkpoint"), "--data", str(root), "--split", "val", "--limit", "500"]  # fmt: skip
    scored = subprocess.run(ev, capture_output=True, text=True, check=True).stdout
    bleu = float(re.search(r"BLEU ([\d.]+)", scored).group(1))  # type: ignore[union-attr]
    return {
        "overrides": overrides,
        "val_loss": val_loss,
        "val_bleu": bleu,
        "train_s": train_s,
        "peak_rss_mib": peak,
        **training_flops(folder / "checkpoint", root, overrides),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trials", nargs="*", default=list(TRIALS), choices=list(TRIALS))
    ap.add_argument("--out", default="runs/demo_sweep")
    ap.add_argument("--data", default=None)
    ap.add_argument("--json", default="benchmarks/results/demo_sweep.json")
    args = ap.parse_args()
    root = data_dir(args.data)
    out = Path(args.out)
    results_path = Path(args.json)
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    print(
        f"{'trial':<14}{'PFLOP':>7}{'val loss':>10}{'val BLEU':>10}{'train s':>9}{'MiB':>7}{'GFLOP/s':>9}"
    )
    for name in args.trials:
        rate = matmul_gflops(2048)
        r = run_trial(name, TRIALS[name], out, root) | {"matmul_fp32_gflops": rate}
        results[name] = r
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=2))
        print(
            f"{name:<14}{r['flops'] / 1e15:>7.2f}{r['val_loss']:>10.3f}{r['val_bleu']:>10.2f}"
            f"{r['train_s']:>9.0f}{r['peak_rss_mib']:>7.0f}{rate:>9.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
