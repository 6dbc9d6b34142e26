"""What decoding in lower precision costs in quality, measured on trained models.

    python benchmarks/precision_quality.py --translation RUN_OR_CHECKPOINT [--lm RUN]
                                           [--sentences 1000] [--data DIR]

* Translation: sacreBLEU of the README's translation model (configs/multi30k_de_en.toml,
  trained with ``aiayn train``) on test_2016_flickr, beam 4, alpha 0.6, decoded in fp32, with
  int8 weights (aiayn/nn/quantized.py), in bf16, and with int8 weights and a bf16 KV cache --
  each through ``aiayn evaluate`` with the flags a user passes.
* Language model: the validation loss of configs/shakespeare_char.toml (trained here when no
  ``--lm`` run is given: 2,000 steps, a minute or two) at the same precisions, 200 batches of
  the fixed validation windows ``aiayn evaluate`` draws.

The targets: BLEU within 0.5 of fp32, validation loss within 1 %.  Writes
benchmarks/results/precision_quality.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PRECISIONS = {
    "float32": ["--dtype", "float32"],
    "int8": ["--quantize", "int8"],
    "bfloat16": ["--dtype", "bfloat16"],
    "int8 + bf16 KV cache": ["--quantize", "int8", "--kv-cache-dtype", "bfloat16"],
}


def aiayn(*argv: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "aiayn", *argv], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"aiayn {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def bleu(checkpoint: str, data: str, sentences: int, flags: list[str]) -> dict[str, Any]:
    out = aiayn(
        "evaluate",
        "--checkpoint",
        checkpoint,
        "--data",
        data,
        "--split",
        "test_2016_flickr",
        "--limit",
        str(sentences),
        "--device",
        "cpu",
        *flags,
    )
    m = re.search(r"BLEU ([\d.]+)\s+chrF ([\d.]+).*\[(.*)\]", out)
    if not m:
        raise RuntimeError(f"no score in: {out}")
    speed = re.search(r"([\d.]+) sentences/s", out)
    return {
        "bleu": float(m.group(1)),
        "chrf": float(m.group(2)),
        "signature": m.group(3),
        "sentences_per_s": float(speed.group(1)) if speed else None,
    }


def val_loss(checkpoint: str, data: str, flags: list[str]) -> float:
    out = aiayn("evaluate", "--checkpoint", checkpoint, "--data", data, "--device", "cpu", *flags)
    m = re.search(r"validation loss\s+([\d.]+)", out)
    if not m:
        raise RuntimeError(f"no loss in: {out}")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--translation", required=True, help="the README translation model's run or checkpoint"
    )
    ap.add_argument("--lm", default=None, help="a shakespeare_char run (default: train one)")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument(
        "--data", default=os.environ.get("AIAYN_DATA", str(ROOT.parent / "shared/data"))
    )
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/precision_quality.json"))
    args = ap.parse_args()
    results: dict[str, Any] = {"translation": {}, "lm": {}}
    for name, flags in PRECISIONS.items():
        results["translation"][name] = got = bleu(
            args.translation, args.data, args.sentences, flags
        )
        print(
            f"translation {name:<22} BLEU {got['bleu']:.2f}  chrF {got['chrf']:.2f}"
            f"  ({got['sentences_per_s']} sentences/s)",
            flush=True,
        )
    lm = args.lm
    with tempfile.TemporaryDirectory() as tmp:
        if lm is None:
            lm = str(Path(tmp) / "lm")
            aiayn(
                "train",
                str(ROOT / "configs/shakespeare_char.toml"),
                "--out",
                lm,
                "--data",
                args.data,
            )
        for name, flags in PRECISIONS.items():
            results["lm"][name] = loss = val_loss(lm, args.data, flags)
            print(f"language model {name:<22} validation loss {loss:.4f}", flush=True)
    base_bleu, base_loss = results["translation"]["float32"]["bleu"], results["lm"]["float32"]
    results["bleu_change"] = {k: v["bleu"] - base_bleu for k, v in results["translation"].items()}
    results["loss_change"] = {k: v / base_loss - 1 for k, v in results["lm"].items()}
    print("BLEU change from fp32:", {k: round(v, 2) for k, v in results["bleu_change"].items()})
    print("loss change from fp32:", {k: f"{v:+.2%}" for k, v in results["loss_change"].items()})
    Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
