"""Commands that train and measure: demo, train, evaluate, experiment."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aiayn.cli.common import _add_decoding, _add_device, _add_precision, _add_set, _train_overrides
from aiayn.data.files import data_dir
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.evaluation.entry import Evaluation

DEMO_CONFIG = Path(__file__).resolve().parent.parent.parent / "configs" / "demo_de_en.toml"


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: train the paper's model on Multi30k for a fixed number of steps, then
    translate test sentences with beam search and score them."""
    import torch

    from aiayn.checkpoint import RunDir, read_run
    from aiayn.checkpoint.run_lock import writer_lock
    from aiayn.cli.loading import _device, _load_translator, _print_result
    from aiayn.data.parallel import multi30k
    from aiayn.device import matmul_gflops
    from aiayn.evaluation.translation import score
    from aiayn.generate.beam import BeamConfig
    from aiayn.generate.translate import translate
    from aiayn.inspect.summary import summarize
    from aiayn.training.config import load_run_config
    from aiayn.training.translate import train_translation

    t_start = time.perf_counter()
    root = data_dir(args.data)
    overrides = _train_overrides(args)
    run = load_run_config(args.config, overrides)
    rd = RunDir(args.out)
    with writer_lock(rd.root):  # a repair deletes what a live writer would still be filling
        rd.recover()
    latest = rd.latest()
    wanted = run.to_dict()
    done = read_run(latest) if latest is not None else {}
    # A demo stopped part-way (Ctrl-C, a kill) continues; any other run there starts again.
    resume = all(done.get(key) == wanted[key] for key in ("train", "data"))
    print(
        f"aiayn demo: {args.config}, {run.train.max_steps} steps of about"
        f" {run.train.max_tokens} tokens, on {root / 'multi30k'}"
        f" (this host: torch.mm at {matmul_gflops():.0f} GFLOP/s in fp32,"
        f" {torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''})"
    )
    if resume:
        print(f"continuing the demo run in {rd.root}")
    result = train_translation(run, args.out, root, resume=resume, overwrite=not resume)
    _print_result(result)
    model, tokenizer, _ = _load_translator(str(result.checkpoint), _device(args))
    print(summarize(model))
    test = multi30k(
        root / "multi30k", "test_2016_flickr", run.data.source_lang, run.data.target_lang
    )[: args.sentences]
    t0 = time.perf_counter()
    hyps = translate(model, tokenizer, [p.source for p in test], beam=BeamConfig())
    decode_s = time.perf_counter() - t0
    for pair, hyp in list(zip(test, hyps, strict=True))[:5]:
        print(f"\n  source     {pair.source}\n  reference  {pair.target}\n  aiayn      {hyp}")
    print(
        f"\ntest_2016_flickr, first {len(test)} sentences, beam 4 ({decode_s:.0f} s):"
        f" {score(hyps, [p.target for p in test])}"
    )
    print(f"demo: {(time.perf_counter() - t_start) / 60:.1f} min in all")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from aiayn.cli.loading import _print_result
    from aiayn.training.entry import train

    result = train(
        args.config,
        args.out,
        data=args.data,
        overrides=_train_overrides(args),
        resume=args.resume,
        overwrite=args.overwrite,
    )
    _print_result(result)
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from aiayn.cli.loading import _beam, _precision
    from aiayn.evaluation.entry import TranslationSet, evaluate

    if args.limit is not None and args.limit < 1:
        raise UserError(f"--limit {args.limit}: score at least 1 sentence")
    tasks = [t.strip() for t in (args.lm_eval or "").split(",") if t.strip()]
    result = evaluate(
        args.checkpoint,
        data=args.data,
        text=args.text,
        sentences=TranslationSet(args.split, args.source, args.reference),
        beam=_beam(args),
        batches=args.batches,
        batch_size=args.batch_size,
        block=args.block,
        limit=args.limit,
        tasks=tasks,
        include_path=args.include_path,
        device=args.device or "auto",
        precision=_precision(args),
    )
    {
        "lm": _print_lm,
        "translation": _print_translation,
        "images": _print_images,
        "lm-eval": _print_lm_eval,
    }[result.task](result, args)
    return 0


def _print_lm(result: Evaluation, args: argparse.Namespace) -> None:
    s = result.scores
    print(f"validation loss    {s['loss']:.4f} nats/token")
    print(f"perplexity         {s['perplexity']:.3f}")
    if "bits_per_character" in s:
        print(f"bits per character {s['bits_per_character']:.4f}")


def _print_translation(result: Evaluation, args: argparse.Namespace) -> None:
    hyps, seconds = result.details["hypotheses"], result.details["seconds"]
    if args.output:
        _write_whole(Path(args.output), "".join(f"{h}\n" for h in hyps))
    print(f"{result.on}: {result.details['summary']}")
    print(f"decoding: {seconds:.1f} s, {len(hyps) / seconds:.1f} sentences/s")


def _print_images(result: Evaluation, args: argparse.Namespace) -> None:
    print(result.on)
    print(f"  Vision Transformer      accuracy {result.scores['accuracy']:.4f}")
    for name, accuracy in result.scores.items():
        if name != "accuracy":
            baseline = name.removesuffix(" accuracy")
            print(f"  {baseline:<23} accuracy {accuracy:.4f}  (same training images)")
    labels = result.details["labels"]
    print("confusion matrix (rows: true class, columns: predicted):")
    print("      " + " ".join(f"{label:>4}" for label in labels))
    for label, row in zip(labels, result.details["confusion"], strict=True):
        print(f"  {label:>3} " + " ".join(f"{n:>4}" for n in row))


def _print_lm_eval(result: Evaluation, args: argparse.Namespace) -> None:
    """lm-evaluation-harness's table of scores, and with ``--output`` the results as JSON."""
    import json

    from lm_eval.utils import make_table

    results = result.details["results"]
    print(make_table(results))
    if args.output:
        responses = {
            task: [s["filtered_resps"] for s in sorted(samples, key=lambda s: s["doc_id"])]
            for task, samples in results.get("samples", {}).items()
        }
        tasks = result.on.split(", ")
        out = {"checkpoint": args.checkpoint, "tasks": tasks, "results": results["results"]}
        text = json.dumps({**out, "responses": responses}, indent=2, default=str) + "\n"
        _write_whole(Path(args.output), text)


def _write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def cmd_experiment(args: argparse.Namespace) -> int:
    from aiayn.experiment import collect, load_sweep, run_sweep, write_report

    sweep = load_sweep(args.sweep)
    out = Path(args.out) if args.out else Path("runs") / Path(args.sweep).stem
    if not args.report_only:
        batches = f" of {sweep.max_tokens} tokens" if sweep.max_tokens else ""
        print(
            f"{sweep.title}: {len(sweep.variants)} variants, {sweep.steps} steps{batches}"
            f" each, in {out}"
        )
        try:
            run_sweep(sweep, out, data_dir(args.data), only=args.only, progress=not args.quiet)
        except BaseException:
            write_report(sweep, collect(sweep, out), out)  # what finished, before stopping
            raise
    results = collect(sweep, out)
    if args.report_only and not results:
        raise UserError(
            f"nothing to report in {out}: no variant of {args.sweep} has finished there"
            " (run the sweep without --report-only, or give its --out)"
        )
    for path in write_report(sweep, results, out):
        print(f"wrote {path}")
    print((out / "table.md").read_text())
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register demo, train, evaluate, experiment."""
    p = sub.add_parser(
        "demo", help="train on Multi30k for a fixed number of steps, translate, print BLEU"
    )
    p.add_argument(
        "--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)"
    )
    p.add_argument("--config", default=str(DEMO_CONFIG))
    p.add_argument("--out", default="runs/demo")
    _add_set(p, "TABLE.FIELD=VALUE", "config overrides")
    p.add_argument("--sentences", type=int, default=200, help="test sentences to score")
    _add_device(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a model from a TOML config (see configs/)")
    p.add_argument("config")
    p.add_argument("--out", default="runs/default", help="run folder: checkpoint/ and log.csv")
    p.add_argument(
        "--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)"
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument(
        "--overwrite", action="store_true", help="replace the run already in OUT (if any)"
    )
    _add_set(p, "TABLE.FIELD=VALUE", "e.g. train.max_steps=100")
    _add_device(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="validation loss, perplexity and bits per character")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", default=None)
    p.add_argument("--text", default=None, help="text file (default: the one the model trained on)")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--block", type=int, default=None)
    p.add_argument("--split", default="test_2016_flickr", help="Multi30k split (translation)")
    p.add_argument("--source", default=None, help="a test set's source file (translation)")
    p.add_argument("--reference", default=None, help="... and its reference translations")
    p.add_argument("--limit", type=int, default=None, help="first N sentences only")
    p.add_argument("--output", default=None, help="write the translations to this file")
    p.add_argument(
        "--lm-eval",
        default=None,
        metavar="TASKS",
        help="score lm-evaluation-harness's tasks (comma-separated) in process; --limit and"
        " --output (JSON) apply",
    )
    p.add_argument(
        "--include-path", default=None, help="a folder of lm-eval task YAMLs (with --lm-eval)"
    )
    _add_decoding(p)
    _add_device(p)
    _add_precision(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser(
        "experiment",
        help="run a sweep of variants (e.g. Table 3), resumable; write its table and plot",
    )
    p.add_argument("sweep", help="a sweep TOML file (experiments/*.toml)")
    p.add_argument("--out", default=None, help="its folder (default: runs/SWEEP_NAME)")
    p.add_argument("--only", nargs="*", default=[], metavar="NAME", help="run only these variants")
    p.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA)")
    p.add_argument("--report-only", action="store_true", help="write the report of what is done")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_experiment)
