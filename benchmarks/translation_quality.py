"""The translation quality benchmark: train configs/multi30k_de_en.toml for its fixed number
of steps, then score test_2016_flickr with sacreBLEU.

    python benchmarks/translation_quality.py [--config C] [--out runs/multi30k_de_en] [--resume]

Reports BLEU (cased, detokenized, 13a) and chrF for beam search (beam 4, α 0.6) and greedy
decoding, the lowercase BLEU that older reimplementations quote, the same for the average of
the last snapshots (§6.1), training time, target tokens/s and the padding fraction; writes JSON.
Also the peak memory of the process and the host's fp32 matmul rate measured in the same run.
Takes about an hour on 2 cores: run it in the background, not in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from aiayn.checkpoint import RunDir, load, save_with_companions
from aiayn.data.files import data_dir
from aiayn.data.parallel import multi30k
from aiayn.data.tokenizer import BPETokenizer
from aiayn.device import matmul_gflops
from aiayn.evaluation.translation import evaluate_translation
from aiayn.generate.beam import PAPER_BEAM
from aiayn.models import EncoderDecoder
from aiayn.training.average import average_checkpoints
from aiayn.training.config import load_run_config
from aiayn.training.translate import train_translation


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default="configs/multi30k_de_en.toml")
    ap.add_argument("--out", default="runs/multi30k_de_en")
    ap.add_argument("--resume", action="store_true", help="continue (or just score) a run")
    ap.add_argument("--set", nargs="*", default=[], metavar="TABLE.FIELD=VALUE")
    ap.add_argument("--data", default=None)
    ap.add_argument("--limit", type=int, default=None, help="score only the first N test sentences")
    ap.add_argument(
        "--json",
        default=str(Path(__file__).resolve().parent / "results" / "translation_quality.json"),
    )
    args = ap.parse_args()
    root = data_dir(args.data)
    from aiayn.cli import _overrides

    run = load_run_config(args.config, _overrides(args.set))
    rate = matmul_gflops(2048)
    t0 = time.perf_counter()
    result = train_translation(
        run, args.out, root, resume=args.resume, overwrite=not args.resume, progress=False
    )
    train_s = time.perf_counter() - t0
    test = multi30k(
        root / "multi30k", "test_2016_flickr", run.data.source_lang, run.data.target_lang
    )
    test = test[: args.limit] if args.limit else test
    sources, refs = [p.source for p in test], [p.target for p in test]
    bundle = load(result.checkpoint)
    model, tokenizer = bundle.model, bundle.tokenizer
    assert isinstance(model, EncoderDecoder) and isinstance(tokenizer, BPETokenizer)
    report: dict[str, Any] = {
        "config": args.config,
        "overrides": args.set,
        "train_seconds": train_s,
        "steps": result.step,
        "target_tokens_per_s": result.tokens_per_s,
        "padding_fraction": result.padding_fraction,
        "val_loss": result.val_loss,
        "peak_rss_mib": result.peak_rss_mib,
        "matmul_fp32_gflops": rate,
    }
    rows = [("final", "beam 4", model, PAPER_BEAM), ("final", "greedy", model, None)]
    snaps = RunDir(args.out).snapshot_dirs()
    if len(snaps) > 1:
        averaged = average_checkpoints(snaps)
        save_with_companions(averaged, Path(args.out) / "averaged", snaps[-1])
        assert isinstance(averaged, EncoderDecoder)
        report["averaged_steps"] = [p.name for p in snaps]
        rows.append((f"average of {len(snaps)}", "beam 4", averaged, PAPER_BEAM))
    print(
        f"trained {report['steps']} steps in {train_s / 60:.1f} min (torch.mm {rate:.0f} GFLOP/s),"
        f" {result.tokens_per_s:,.0f} target tokens/s, padding {result.padding_fraction or 0:.1%},"
        f" peak memory {result.peak_rss_mib:,.0f} MiB"
    )
    for name, mode, m, beam in rows:
        t1 = time.perf_counter()
        scores, _ = evaluate_translation(m, tokenizer, sources, refs, beam=beam)
        seconds = time.perf_counter() - t1
        print(f"{name:<16}{mode:<8} {scores}  ({len(test) / seconds:.0f} sentences/s)")
        report[f"{name}/{mode}"] = {
            "bleu": scores.bleu,
            "chrf": scores.chrf,
            "bleu_lowercase": scores.bleu_lowercase,
            "signature": scores.signature,
        }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
