"""Running a sweep: every variant a resumable training run, then scored the same way.

::

    OUT/runs/NAME/          the variant's run folder (checkpoints, log.csv: aiayn train's)
    OUT/runs/NAME/timing.json   training seconds of each invocation that ran it
    OUT/runs/NAME/result.json   its scores, written last: a variant with one is done

A killed sweep, run again, skips the variants that have a result, resumes the one that was
training from its last checkpoint, and goes on.  A variant whose settings changed since its
run started is an error naming it, not a silent mix of two configs.

Each finished variant is scored by:

* validation cross entropy per target token (unsmoothed) and its perplexity, from the
  training loop's final evaluation;
* a translation model: sacreBLEU (and chrF) on the validation set, and on the test set when
  the sweep asks (a language model is scored by its validation loss alone);
* its training FLOPs, counted over the batches it trained on (aiayn/inspect/calc.py,
  ``translation_batch_flops``; a language model's batches all have
  one shape: ``training_flops_per_token``), and its training wall time with the
  host's fp32 matmul rate measured beside it -- the time depends on the host and on what else
  ran; the work does not.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiayn.checkpoint import RunDir, load, read_run
from aiayn.config import dotted_settings
from aiayn.config.model import upgrade_flat_names
from aiayn.config.run import RunConfig
from aiayn.data.batching import batch_shapes
from aiayn.data.parallel import multi30k
from aiayn.data.tokenizer import BPETokenizer
from aiayn.device import matmul_gflops
from aiayn.errors import NonFiniteLoss, TrainingInterrupted, UserError
from aiayn.evaluation.translation import evaluate_translation
from aiayn.experiment.spec import Sweep, Variant
from aiayn.generate.beam import BeamConfig
from aiayn.inspect.calc import training_flops_per_token, translation_batch_flops
from aiayn.models import EncoderDecoder
from aiayn.training.lm import train_lm
from aiayn.training.loop import FitResult
from aiayn.training.translate import encode_pairs, load_pairs, train_translation

RESULT_FILE = "result.json"
TIMING_FILE = "timing.json"
# An invocation in progress: its start on the wall clock.  One killed outright (SIGKILL, a lost
# machine) never writes its time; the next invocation finds this and counts it.
OPEN_FILE = "timing.open.json"


def _write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON in one step (a temporary file renamed over the target)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1))
    os.replace(tmp, path)


def _timing(folder: Path) -> list[float]:
    path = folder / TIMING_FILE
    return [float(s) for s in json.loads(path.read_text())] if path.is_file() else []


def _close_killed(folder: Path) -> None:
    """Count an invocation that was killed before it could write its time: from its start to
    its last checkpoint, the work that was kept (what came after is trained again)."""
    marker = folder / OPEN_FILE
    if not marker.is_file():
        return
    started = float(json.loads(marker.read_text())["started"])
    latest = RunDir(folder).latest()
    kept = 0.0 if latest is None else latest.stat().st_mtime - started
    if kept > 0:  # it saved a checkpoint of its own
        _write_json(folder / TIMING_FILE, [*_timing(folder), kept])
    marker.unlink()


def _defaults() -> dict[str, dict[str, Any]]:
    """Every setting's default, per table (the model's by dotted names): a run saved before a
    setting existed ran with it."""
    from aiayn.config import ModelConfig
    from aiayn.config.run import DataConfig, TrainConfig

    return json.loads(
        json.dumps(
            {
                "model": dotted_settings(ModelConfig().to_dict()),
                "data": dataclasses.asdict(DataConfig()),
                "train": dataclasses.asdict(TrainConfig()),
            }
        )
    )


def _differences(saved: dict[str, Any], now: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """The settings whose values differ; one missing on either side counts as its default."""
    keys = set(saved) | set(now)
    return sorted(k for k in keys if saved.get(k, defaults.get(k)) != now.get(k, defaults.get(k)))


def _check_same_config(folder: Path, run: RunConfig, name: str) -> None:
    """A run started under other settings must not be continued (or its result reused) under
    these.  The vocabulary size and padding id are set from the tokenizer, not compared."""
    latest = RunDir(folder).latest()
    if latest is None:
        return
    saved = read_run(latest)
    now = json.loads(json.dumps(run.to_dict()))
    defaults = _defaults()
    for table in ("train", "data", "model"):
        before, after = dict(saved.get(table, {})), dict(now[table])
        if table == "model":  # saved flat by older aiayn, nested now: by dotted names
            before = dotted_settings(upgrade_flat_names(before))
            after = dotted_settings(after)
            for key in ("vocab_size", "pad_id"):
                before.pop(key, None), after.pop(key, None)
        changed = _differences(before, after, defaults[table])
        if changed:
            raise UserError(
                f"variant {name!r}: its run in {folder} was started with other [{table}]"
                f" settings ({', '.join(changed)}); remove that folder to start it again, or"
                " rename the variant"
            )


def training_flops(
    run: RunConfig, model_config: Any, tokenizer: BPETokenizer, root: Path
) -> tuple[float, int]:
    """FLOPs of the batches the run trained on, in order, and the target tokens they held
    (padding excluded) -- the same batches ``TranslationTask``
    draws: token-count batches of the training pairs, reshuffled every epoch, ``grad_accum``
    of them per step (a sweep runs in one process)."""
    pairs = encode_pairs(load_pairs(run, root, "train"), tokenizer)
    lengths = [(len(s), len(t) - 1) for s, t in pairs]
    tc = run.train
    max_tokens = tc.max_tokens or tc.batch_size * max(max(s, t) for s, t in lengths)
    flops, tokens = 0.0, 0
    total = tc.max_steps * tc.grad_accum  # batches
    for sentences, source, target, real in batch_shapes(
        lengths, max_tokens, seed=tc.seed, batches=total
    ):
        flops += translation_batch_flops(model_config, sentences, source, target)
        tokens += real
    return flops, tokens


def _bleu(
    model: EncoderDecoder,
    tokenizer: BPETokenizer,
    pairs: Sequence[Any],
    beam: BeamConfig | None,
) -> tuple[float, float]:
    scores, _ = evaluate_translation(
        model, tokenizer, [p.source for p in pairs], [p.target for p in pairs], beam=beam
    )
    return scores.bleu, scores.chrf


def _model_summary(c: Any) -> dict[str, Any]:
    return {
        "arch": c.arch,
        "n_layers": c.n_layers,
        "n_decoder_layers": c.decoder_layers,
        "d_model": c.d_model,
        "d_ff": c.ffn.d_ff,
        "n_heads": c.attention.n_heads,
        "d_head": c.head_dim,
        "dropout": c.dropout,
        "positional": c.positions.scheme,
        "norm_position": c.norm_position,
        "attention_score": c.attention.score,
        "attention_scale": c.attention.scale,
        "residual": c.residual,
        "rnn": c.rnn.cell,
        "rnn_attention": c.rnn.attention if c.rnn.cell else None,
        "mixer": c.mixer.kind,
        "attention_every": c.mixer.attention_every,
    }


def score_variant(
    sweep: Sweep, variant: Variant, folder: Path, root: Path, *, diverged: str | None = None
) -> dict[str, Any]:
    """The finished run's scores (see the module docstring)."""
    run = sweep.run_config(variant)
    result: dict[str, Any] = {
        "name": variant.name,
        "row": variant.row,
        "note": variant.note,
        "overrides": variant.overrides,
        "steps": sweep.steps,
        "max_tokens": sweep.max_tokens,
        "train_seconds": sum(_timing(folder)),
        "train_invocations": len(_timing(folder)),
        "diverged": diverged,
    }
    bundle = load(folder / "checkpoint")
    model, tokenizer = bundle.model, bundle.tokenizer
    c = model.config
    result["model"] = _model_summary(c)
    result["label_smoothing"] = run.train.label_smoothing
    result["params"] = model.num_parameters()
    result["params_non_embedding"] = model.num_parameters(exclude_embeddings=True)
    history = RunDir(folder).load()[1].history
    vals = [h["val_loss"] for h in history if "val_loss" in h]
    result["val_loss"] = vals[-1] if vals else math.nan
    result["val_ppl"] = math.exp(min(result["val_loss"], 50.0))
    result["best_val_loss"] = min(vals) if vals else math.nan
    if c.arch == "decoder":  # a language model: the loss is the score
        tc = run.train
        tokens = sweep.steps * tc.batch_size * tc.block_size * tc.grad_accum
        result["train_tokens"] = tokens
        result["train_flops"] = float(training_flops_per_token(c, tc.block_size) * tokens)
        return result
    assert isinstance(model, EncoderDecoder) and isinstance(tokenizer, BPETokenizer)
    flops, tokens = training_flops(run, c, tokenizer, root)
    result["train_flops"], result["train_target_tokens"] = flops, tokens
    beam = BeamConfig(beam_size=sweep.beam) if sweep.beam else None
    model.eval()
    src, tgt = run.data.source_lang, run.data.target_lang
    val_pairs = load_pairs(run, root, "val")
    if sweep.val_limit:
        val_pairs = val_pairs[: sweep.val_limit]
    t0 = time.perf_counter()
    result["val_bleu"], result["val_chrf"] = _bleu(model, tokenizer, val_pairs, beam)
    result["val_sentences"] = len(val_pairs)
    if sweep.test:
        test_pairs = multi30k(root / "multi30k", "test_2016_flickr", src, tgt)
        result["test_bleu"], result["test_chrf"] = _bleu(model, tokenizer, test_pairs, beam)
        result["test_sentences"] = len(test_pairs)
    result["score_seconds"] = time.perf_counter() - t0
    return result


def _train(run: RunConfig, folder: Path, root: Path, **kw: Any) -> FitResult:
    trainer = train_lm if run.model.arch == "decoder" else train_translation
    return trainer(run, folder, root, **kw)


def run_variant(
    sweep: Sweep,
    variant: Variant,
    out: Path,
    root: Path,
    *,
    progress: bool = True,
    stop_after: int | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any] | None:
    """Train (or resume) and score one variant; its result, or None when ``stop_after``
    stopped it early (a planned interruption, for tests)."""
    folder = out / "runs" / variant.name
    done = folder / RESULT_FILE
    run = sweep.run_config(variant)
    if done.is_file():
        result: dict[str, Any] = json.loads(done.read_text())
        if result.get("overrides") != json.loads(json.dumps(variant.overrides)):
            raise UserError(
                f"variant {variant.name!r} was run with other settings ({result.get('overrides')});"
                f" remove {folder} to run it again, or rename the variant"
            )
        # The whole resolved config -- base file, shared settings, steps -- must match too.
        _check_same_config(folder, run, variant.name)
        return result
    _check_same_config(folder, run, variant.name)
    # A run killed before its first checkpoint left only a log: nothing to resume, start over.
    resume = RunDir(folder).latest() is not None
    folder.mkdir(parents=True, exist_ok=True)
    _close_killed(folder)
    rate = matmul_gflops(2048)
    say(f"{variant.name}: {'resuming' if resume else 'training'} ({rate:.0f} GFLOP/s fp32 here)")
    t0 = time.perf_counter()
    _write_json(folder / OPEN_FILE, {"started": time.time()})
    diverged = None
    try:
        fit = _train(
            run,
            folder,
            root,
            resume=resume,
            overwrite=not resume,
            stop_after=stop_after,
            progress=progress,
        )
    except NonFiniteLoss as err:
        diverged, fit = str(err), None
    finally:
        _write_json(folder / TIMING_FILE, [*_timing(folder), time.perf_counter() - t0])
        (folder / OPEN_FILE).unlink(missing_ok=True)
    if fit is not None and not fit.complete:
        return None
    if diverged is not None and RunDir(folder).latest() is None:
        result = {
            "name": variant.name,
            "row": variant.row,
            "note": variant.note,
            "overrides": variant.overrides,
            "diverged": diverged,
        }
    else:
        result = score_variant(sweep, variant, folder, root, diverged=diverged)
    result["matmul_gflops"] = rate
    _write_json(done, result)
    return result


def run_sweep(
    sweep: Sweep,
    out: Path,
    root: Path,
    *,
    only: Sequence[str] = (),
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run every variant (or those named in ``only``) in the file's order; the results of
    all that are done."""
    chosen = [sweep.variant(n) for n in only] if only else list(sweep.variants)
    out.mkdir(parents=True, exist_ok=True)
    for variant in chosen:
        try:
            result = run_variant(sweep, variant, out, root, progress=progress, say=say)
        except TrainingInterrupted:
            say(f"{variant.name}: interrupted; run the sweep again to continue it")
            raise
        if result is not None:
            say(_summary(result))
    return collect(sweep, out)


def collect(sweep: Sweep, out: Path) -> list[dict[str, Any]]:
    """The results written so far, in the sweep file's order."""
    found = []
    for v in sweep.variants:
        path = out / "runs" / v.name / RESULT_FILE
        if path.is_file():
            found.append(json.loads(path.read_text()))
    return found


def _summary(r: dict[str, Any]) -> str:
    if "val_loss" not in r:
        return f"{r['name']}: diverged before its first checkpoint"
    if "val_bleu" not in r:
        return (
            f"{r['name']}: val loss {r['val_loss']:.4f}; {r['params'] / 1e6:.2f}M params,"
            f" {r['train_flops'] / 1e12:.1f} TFLOP, {r['train_seconds'] / 60:.1f} min"
        )
    test = f", test BLEU {r['test_bleu']:.2f}" if "test_bleu" in r else ""
    return (
        f"{r['name']}: val ppl {r['val_ppl']:.2f}, val BLEU {r['val_bleu']:.2f}{test};"
        f" {r['params'] / 1e6:.1f}M params, {r['train_flops'] / 1e12:.1f} TFLOP,"
        f" {r['train_seconds'] / 60:.1f} min"
    )
