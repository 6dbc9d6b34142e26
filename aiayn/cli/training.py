"""Commands that train and measure: demo, train, evaluate, experiment."""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

from aiayn.cli.common import _add_decoding, _add_device, _add_precision, _add_set, _train_overrides
from aiayn.data.files import data_dir
from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.models import EncoderDecoder

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
    from aiayn.evaluate.translation import score
    from aiayn.generate.beam import BeamConfig
    from aiayn.generate.translate import translate
    from aiayn.inspect.summary import summarize
    from aiayn.train.config import load_run_config
    from aiayn.train.translate import train_translation

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
    from aiayn.train.entry import run_training

    result = run_training(
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
    import math

    from aiayn.checkpoint import load
    from aiayn.cli.loading import _device, _precision
    from aiayn.data.lm_data import TokenStream
    from aiayn.evaluate.perplexity import evaluate_lm
    from aiayn.models import EncoderDecoder
    from aiayn.models.precision import apply_precision
    from aiayn.nn.cpu_decoding import for_decoding

    bundle = load(args.checkpoint)
    model, tokenizer = bundle.model, bundle.tokenizer
    apply_precision(model, _device(args), _precision(args))
    if args.lm_eval:
        return _evaluate_lm_eval(args, model, tokenizer)
    data = bundle.run.get("data", {})
    if isinstance(model, EncoderDecoder):
        return _evaluate_translation(args, model, tokenizer, data)
    if model.config.vision.image_size is not None:
        return _evaluate_images(model, bundle.run)
    text = args.text or data.get("text")
    if not text:
        raise UserError("no text to evaluate on: pass --text FILE")
    path = Path(text) if Path(text).is_file() else data_dir(args.data) / text
    stream = TokenStream.from_file(path, tokenizer, train_fraction=data.get("train_fraction", 0.9))
    block = args.block or model.config.max_len
    # int8 weights run their decoding kernel (quantized activations), as generation does
    int8 = model.config.quantization == "int8"
    with for_decoding(model, args.batch_size * block) if int8 else contextlib.nullcontext():
        loss = evaluate_lm(
            model,  # type: ignore[arg-type]
            stream,
            batches=args.batches,
            batch_size=args.batch_size,
            block=block,
        )
    print(f"validation loss    {loss:.4f} nats/token")
    print(f"perplexity         {math.exp(loss):.3f}")
    if tokenizer.kind == "char":
        print(f"bits per character {loss / math.log(2):.4f}")
    return 0


def _evaluate_lm_eval(args: argparse.Namespace, model: object, tokenizer: object) -> int:
    """lm-evaluation-harness's tasks, in process (aiayn/evaluate/lm_eval.py): its table of
    scores, and with ``--output`` the results as JSON."""
    import json

    from lm_eval.utils import make_table

    from aiayn.evaluate.lm_eval import AiaynLM, evaluate_tasks
    from aiayn.models import DecoderLM

    if not isinstance(model, DecoderLM):
        raise UserError(
            f"--lm-eval scores language models; {args.checkpoint} holds a {type(model).__name__}"
        )
    lm = AiaynLM(model, tokenizer, batch_size=args.batch_size)  # type: ignore[arg-type]
    tasks = [t.strip() for t in args.lm_eval.split(",") if t.strip()]
    results = evaluate_tasks(lm, tasks, include_path=args.include_path, limit=args.limit)
    print(make_table(results))
    if args.output:
        responses = {
            task: [s["filtered_resps"] for s in sorted(samples, key=lambda s: s["doc_id"])]
            for task, samples in results.get("samples", {}).items()
        }
        out = {"checkpoint": args.checkpoint, "tasks": tasks, "results": results["results"]}
        text = json.dumps({**out, "responses": responses}, indent=2, default=str) + "\n"
        tmp = Path(args.output).with_name(Path(args.output).name + ".tmp")
        tmp.write_text(text)
        tmp.replace(args.output)  # whole or not at all
    return 0


def _evaluate_images(model: object, run: dict[str, object]) -> int:
    from aiayn.config.run import DataConfig
    from aiayn.data.images import load_split
    from aiayn.evaluate.images import baselines, score_classifier
    from aiayn.models.vision import VisionTransformer

    assert isinstance(model, VisionTransformer)
    d = DataConfig(**run.get("data", {}))  # type: ignore[arg-type]
    split = load_split(d.images, test_fraction=d.test_fraction, seed=d.seed)
    scores = score_classifier(model, split)
    print(f"{d.images}: {scores['test_images']} held-out test images (never trained on)")
    print(f"  Vision Transformer      accuracy {scores['accuracy']:.4f}")
    for name, accuracy in baselines(split).items():
        print(f"  {name:<23} accuracy {accuracy:.4f}  (same training images)")
    print("confusion matrix (rows: true class, columns: predicted):")
    print("      " + " ".join(f"{label:>4}" for label in split.labels))
    for label, row in zip(split.labels, scores["confusion"], strict=True):
        print(f"  {label:>3} " + " ".join(f"{n:>4}" for n in row))
    return 0


def _evaluate_translation(
    args: argparse.Namespace, model: EncoderDecoder, tokenizer: object, data: dict[str, object]
) -> int:
    from aiayn.cli.loading import _beam
    from aiayn.data.parallel import multi30k, read_parallel
    from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer
    from aiayn.evaluate.translation import evaluate_translation

    if not isinstance(tokenizer, BPETokenizer | MarianTokenizer):
        raise UserError("a translation checkpoint needs a BPE or Marian tokenizer")
    src_lang, tgt_lang = str(data.get("source_lang", "de")), str(data.get("target_lang", "en"))
    if bool(args.source) != bool(args.reference):
        raise UserError("--source and --reference go together: a test set's two files")
    if args.source:  # a test set of one's own (newstest2014 from aiayn download)
        pairs = read_parallel(args.source, args.reference)
        name = f"{args.source} -> {args.reference}"
    else:
        pairs = multi30k(data_dir(args.data) / "multi30k", args.split, src_lang, tgt_lang)
        name = f"{args.split} {src_lang}->{tgt_lang}"
    if args.limit is not None:
        if args.limit < 1:
            raise UserError(f"--limit {args.limit}: score at least 1 sentence")
        pairs = pairs[: args.limit]
    sources, refs = [p.source for p in pairs], [p.target for p in pairs]
    t0 = time.perf_counter()
    scores, hyps = evaluate_translation(model.eval(), tokenizer, sources, refs, beam=_beam(args))
    seconds = time.perf_counter() - t0
    if args.output:
        Path(args.output).write_text("".join(f"{h}\n" for h in hyps), encoding="utf-8")
    mode = "greedy" if args.greedy else f"beam {args.beam}, alpha {args.alpha}"
    print(f"{name}, {len(pairs)} sentences, {mode}: {scores}")
    print(f"decoding: {seconds:.1f} s, {len(pairs) / seconds:.1f} sentences/s")
    return 0


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
