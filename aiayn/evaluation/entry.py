"""``aiayn.evaluate``: score a checkpoint on held-out data, whatever the model -- the library
call behind ``aiayn evaluate``.

>>> result = aiayn.evaluate("runs/shakespeare_char")  # the text it trained on, held-out part
>>> result.scores["perplexity"]

What is scored follows the model:

* a language model: the validation loss of its text's held-out part (the run's
  ``train_fraction``), as perplexity and, for characters, bits per character;
* an encoder-decoder: sacreBLEU and chrF of its translations (beam search of §6.1 by default)
  of a Multi30k split or of a test set given as two files;
* a Vision Transformer: accuracy on the held-out test images, beside two baselines trained on
  the same images;
* ``tasks``: lm-evaluation-harness's tasks, in process (aiayn/evaluation/lm_eval.py).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.checkpoint import Bundle, load
from aiayn.data.files import data_dir
from aiayn.device import resolve_device
from aiayn.errors import UserError
from aiayn.generate.beam import BeamConfig
from aiayn.models import DecoderLM, EncoderDecoder
from aiayn.models.precision import Precision, apply_precision

PAPER_BEAM = BeamConfig()  # beam 4, length penalty 0.6 (§6.1)


@dataclass(frozen=True)
class Evaluation:
    """What ``evaluate`` measured.  ``task``: "lm", "translation", "images" or "lm-eval";
    ``on``: what was scored; ``scores``: the numbers by name; ``details``: the rest
    (translations, a confusion matrix, lm-eval's full results)."""

    task: str
    on: str
    scores: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TranslationSet:
    """Which sentences a translation model is scored on: a Multi30k ``split``, or a test set
    of one's own as two files (``source`` and ``reference``)."""

    split: str = "test_2016_flickr"
    source: str | os.PathLike[str] | None = None
    reference: str | os.PathLike[str] | None = None


def evaluate(
    checkpoint: str | os.PathLike[str],
    *,
    data: str | os.PathLike[str] | None = None,
    text: str | os.PathLike[str] | None = None,
    sentences: TranslationSet | None = None,
    beam: BeamConfig | None = PAPER_BEAM,
    batches: int = 200,
    batch_size: int = 12,
    block: int | None = None,
    limit: int | None = None,
    tasks: Sequence[str] | None = None,
    include_path: str | None = None,
    device: str = "auto",
    precision: Precision | None = None,
) -> Evaluation:
    """Score the checkpoint, run or Hugging Face folder ``checkpoint`` (module docstring).

    ``data``: the folder the run's data paths are relative to (default ``$AIAYN_DATA``);
    ``text``: a language model's text file (default: the run's); ``sentences``: a translation
    model's test set; ``beam``: None for greedy decoding; ``batches`` of ``batch_size`` windows
    of ``block`` tokens (default: the model's ``max_len``) for a language model; ``limit``: the
    first sentences (or lm-eval documents) only; ``tasks``: lm-eval task names
    (``include_path``: a folder of task YAMLs)."""
    if limit is not None and limit < 1:
        raise UserError(f"limit={limit}: score at least 1 sentence")
    bundle = load(checkpoint)
    apply_precision(bundle.model, resolve_device(device), precision or Precision())
    if tasks:
        return _lm_eval(bundle, list(tasks), include_path, batch_size, limit)
    run_data = bundle.run.get("data", {})
    if isinstance(bundle.model, EncoderDecoder):
        test_set = sentences or TranslationSet()
        return _translation(bundle, _pairs(run_data, data, test_set, limit), beam)
    if bundle.model.config.vision.image_size is not None:
        return _images(bundle)
    return _language_model(bundle, run_data, data, text, (batches, batch_size, block))


def _language_model(
    bundle: Bundle,
    run_data: dict[str, Any],
    data: str | os.PathLike[str] | None,
    text: str | os.PathLike[str] | None,
    shape: tuple[int, int, int | None],
) -> Evaluation:
    from aiayn.data.lm_data import TokenStream
    from aiayn.evaluation.perplexity import evaluate_lm
    from aiayn.nn.cpu_decoding import for_decoding

    model, tokenizer = bundle.model, bundle.tokenizer
    name = text or run_data.get("text")
    if not name:
        raise UserError("no text to evaluate on: give a text file (--text FILE)")
    path = Path(name) if Path(name).is_file() else data_dir(data) / name
    fraction = run_data.get("train_fraction", 0.9)
    stream = TokenStream.from_file(path, tokenizer, train_fraction=fraction)
    batches, batch_size, block = shape
    block = block or model.config.max_len
    # int8 weights run their decoding kernel (quantized activations), as generation does
    int8 = model.config.quantization == "int8"
    with for_decoding(model, batch_size * block) if int8 else contextlib.nullcontext():
        loss = evaluate_lm(
            model,  # type: ignore[arg-type]
            stream,
            batches=batches,
            batch_size=batch_size,
            block=block,
        )
    scores = {"loss": loss, "perplexity": math.exp(loss)}
    if tokenizer.kind == "char":
        scores["bits_per_character"] = loss / math.log(2)
    return Evaluation("lm", f"{path} (held-out {1 - fraction:.0%})", scores)


def _translation(
    bundle: Bundle, test_set: tuple[str, list[Any]], beam: BeamConfig | None
) -> Evaluation:
    from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer
    from aiayn.evaluation.translation import evaluate_translation

    model, tokenizer = bundle.model, bundle.tokenizer
    assert isinstance(model, EncoderDecoder)
    if not isinstance(tokenizer, BPETokenizer | MarianTokenizer):
        raise UserError("a translation checkpoint needs a BPE or Marian tokenizer")
    name, pairs = test_set
    sources, refs = [p.source for p in pairs], [p.target for p in pairs]
    t0 = time.perf_counter()
    scores, hyps = evaluate_translation(model.eval(), tokenizer, sources, refs, beam=beam)
    seconds = time.perf_counter() - t0
    mode = "greedy" if beam is None else f"beam {beam.beam_size}, alpha {beam.length_penalty}"
    return Evaluation(
        "translation",
        f"{name}, {len(pairs)} sentences, {mode}",
        {"bleu": scores.bleu, "chrf": scores.chrf},
        {"hypotheses": hyps, "seconds": seconds, "summary": str(scores)},
    )


def _pairs(
    run_data: dict[str, Any],
    data: str | os.PathLike[str] | None,
    sentences: TranslationSet,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """(a name for the test set, its sentence pairs)."""
    from aiayn.data.parallel import multi30k, read_parallel

    s = sentences
    if (s.source is None) != (s.reference is None):
        raise UserError(
            "a test set's source and reference files go together (--source, --reference)"
        )
    if s.source is not None and s.reference is not None:  # newstest2014 from aiayn download
        pairs = read_parallel(s.source, s.reference)
        name = f"{s.source} -> {s.reference}"
    else:
        src, tgt = str(run_data.get("source_lang", "de")), str(run_data.get("target_lang", "en"))
        pairs = multi30k(data_dir(data) / "multi30k", s.split, src, tgt)
        name = f"{s.split} {src}->{tgt}"
    return name, pairs[:limit]


def _images(bundle: Bundle) -> Evaluation:
    from aiayn.config.run import DataConfig
    from aiayn.data.images import load_split
    from aiayn.evaluation.images import baselines, score_classifier
    from aiayn.models.vision import VisionTransformer

    assert isinstance(bundle.model, VisionTransformer)
    d = DataConfig(**bundle.run.get("data", {}))
    split = load_split(d.images, test_fraction=d.test_fraction, seed=d.seed)
    result = score_classifier(bundle.model, split)
    scores = {"accuracy": result["accuracy"]}
    scores |= {f"{name} accuracy": acc for name, acc in baselines(split).items()}
    on = f"{d.images}: {result['test_images']} held-out test images (never trained on)"
    return Evaluation(
        "images", on, scores, {"labels": split.labels, "confusion": result["confusion"]}
    )


def _lm_eval(
    bundle: Bundle,
    tasks: list[str],
    include_path: str | None,
    batch_size: int,
    limit: int | None,
) -> Evaluation:
    from aiayn.evaluation.lm_eval import AiaynLM, evaluate_tasks

    if not isinstance(bundle.model, DecoderLM):
        raise UserError(f"lm-eval scores language models; this is a {type(bundle.model).__name__}")
    lm = AiaynLM(bundle.model, bundle.tokenizer, batch_size=batch_size)
    results = evaluate_tasks(lm, tasks, include_path=include_path, limit=limit)
    scores = {
        f"{task}/{metric}": float(value)
        for task, metrics in results["results"].items()
        for metric, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    return Evaluation("lm-eval", ", ".join(tasks), scores, {"results": results})
