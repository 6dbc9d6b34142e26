"""Training from token shards is training from the plain files: the same batches, the same
weights, the same BLEU.

    python benchmarks/shards_vs_files.py [--config configs/multi30k_de_en.toml] [--steps N]
                                         [--sentences 1000] [--work DIR]

Preprocesses the config's data with ``aiayn preprocess`` (every core), then trains the config
twice in this process, once from Multi30k's plain files and once from the shards, for its
``max_steps`` (or ``--steps``); compares every batch of the run's epochs (indices and tensors),
the final weights bit for bit, and the sacreBLEU of each model (beam 4, alpha 0.6) on the
first ``--sentences`` of test_2016_flickr.  Writes benchmarks/results/shards_vs_files.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(ROOT / "configs/multi30k_de_en.toml"))
    ap.add_argument("--steps", type=int, default=None, help="default: the config's max_steps")
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--work", default=None)
    ap.add_argument(
        "--data", default=os.environ.get("AIAYN_DATA", str(ROOT.parent / "shared/data"))
    )
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/shards_vs_files.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from aiayn.checkpoint import load
    from aiayn.cli import main as cli
    from aiayn.data.parallel import multi30k
    from aiayn.device import matmul_gflops
    from aiayn.evaluation.translation import evaluate_translation
    from aiayn.generate.beam import PAPER_BEAM
    from aiayn.training.config import load_run_config
    from aiayn.training.translate import PlainFiles, TokenShards, TranslationTask, train_translation

    data, work = Path(args.data), Path(args.work or tempfile.mkdtemp(prefix="aiayn-shards-"))
    overrides: dict[str, object] = {"train.device": "cpu"}
    if args.steps:
        overrides["train.max_steps"] = args.steps
    run = load_run_config(args.config, overrides)
    print(
        f"{Path(args.config).name}, {run.train.max_steps} steps; torch.mm fp32 {matmul_gflops(2048):.0f} GFLOP/s"
    )
    shards = work / "shards"
    if not shards.exists():
        assert cli(["preprocess", args.config, "--data", str(data), "--out", str(shards)]) == 0
    result: dict[str, Any] = {"config": Path(args.config).name, "steps": run.train.max_steps}
    # every batch the run draws, from both sources
    files, from_shards = PlainFiles(run, data), TokenShards(shards)
    tokenizer = files.tokenizer()
    tasks = [
        TranslationTask(
            *src.splits(tokenizer, run.model.max_len),
            max_tokens=run.train.max_tokens or 0,
            label_smoothing=0.1,
            seed=run.train.seed,
        )
        for src in (files, from_shards)
    ]
    draws = run.train.max_steps * run.train.grad_accum
    same = all(
        all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        for a, b in (
            (tasks[0].next_batches(1, 0, 1)[0], tasks[1].next_batches(1, 0, 1)[0])
            for _ in range(draws)
        )
    )
    result["batches_compared"], result["batches_equal"] = draws, same
    print(f"{draws:,} batches drawn from each: equal = {same}")
    models = {}
    for name, extra in (("files", {}), ("shards", {"data.shards": str(shards)})):
        t0 = time.perf_counter()
        fitted = load_run_config(args.config, {**overrides, **extra})
        train_translation(fitted, work / name, data, overwrite=True, progress=False)
        models[name] = load(work / name / "checkpoint")
        result[f"{name}_train_minutes"] = (time.perf_counter() - t0) / 60
    a, b = (models[k].model.state_dict() for k in ("files", "shards"))
    result["weights_equal"] = all(torch.equal(a[k], b[k]) for k in a)
    print(f"final weights equal bit for bit: {result['weights_equal']}")
    pairs = multi30k(
        data / "multi30k", "test_2016_flickr", run.data.source_lang, run.data.target_lang
    )
    pairs = pairs[: args.sentences]
    for name, bundle in models.items():
        scores, _ = evaluate_translation(
            bundle.model.eval(),
            bundle.tokenizer,
            [p.source for p in pairs],
            [p.target for p in pairs],
            beam=PAPER_BEAM,
        )
        result[f"{name}_bleu"], result["signature"] = scores.bleu, scores.signature
        print(f"from {name}: {scores}")
    Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
