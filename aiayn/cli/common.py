"""Shared by the commands: config overrides, devices, loading checkpoints, decoding options."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import torch

from aiayn.checkpoint import Bundle, load
from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer, Tokenizer
from aiayn.generate.beam import BeamConfig
from aiayn.generate.sampling import SamplingConfig
from aiayn.interop.generation_config import GenerationIds, generation_of
from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM, TransformerModel
from aiayn.models.precision import Precision, apply_precision
from aiayn.train.loop import FitResult

M = TypeVar("M", bound=TransformerModel)


def _overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``key=value`` pairs; values parsed as int, float, bool or None when they look like one."""
    out: dict[str, object] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"override {pair!r} is not of the form field=value")
        key, raw = pair.split("=", 1)
        value: object = raw
        if raw in ("true", "false"):
            value = raw == "true"
        elif raw == "none":
            value = None
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def _train_overrides(args: argparse.Namespace) -> dict[str, object]:
    """``--set`` overrides, with ``--device`` as ``train.device`` when given."""
    return _overrides(args.set) | ({"train.device": args.device} if args.device else {})


def _beam(args: argparse.Namespace) -> BeamConfig | None:
    if args.greedy:
        return None
    return BeamConfig(beam_size=args.beam, length_penalty=args.alpha, max_extra=args.max_extra)


def _device(args: argparse.Namespace) -> torch.device:
    from aiayn.device import resolve_device

    return resolve_device(getattr(args, "device", "auto") or "auto")


def _load_as(
    path: str, kind: type[M], what: str, device: torch.device | None,
    precision: Precision | None = None,
) -> tuple[M, Bundle]:  # fmt: skip
    """The model of the checkpoint, run or Hugging Face folder ``path``
    (:func:`aiayn.checkpoint.load`), which must be a ``kind`` (``what`` names it in the
    error), in evaluation mode and, given a ``device``, ready for inference there in
    ``precision`` (the device's dtype by default); and its bundle."""
    bundle = load(path)
    model = bundle.model
    if not isinstance(model, kind):
        raise ValueError(f"{path} holds a {type(model).__name__}, not {what}")
    if device is not None:
        apply_precision(model, device, precision or Precision())
    return model.eval(), bundle


def _load_translator(
    path: str, device: torch.device | None = None, precision: Precision | None = None
) -> tuple[EncoderDecoder, BPETokenizer | MarianTokenizer, GenerationIds]:
    """A translation model, its tokenizer and its folder's generation ids (none for a model
    aiayn trained)."""
    model, bundle = _load_as(path, EncoderDecoder, "a translation model", device, precision)
    if not isinstance(bundle.tokenizer, BPETokenizer | MarianTokenizer):
        raise ValueError(f"{path} is not a translation checkpoint (an encoder-decoder with BPE)")
    return model, bundle.tokenizer, generation_of(bundle.run)


def _check_out(path: str, overwrite: bool) -> None:
    """``--out`` of a command that writes one whole folder, replacing what is there: a new or
    empty folder, or with ``--overwrite`` an existing one -- but never a link (a run's
    ``checkpoint`` link) or a training run, whose other files would go with it."""
    out = Path(path)
    if out.is_symlink():
        raise ValueError(f"--out {out} is a link; give the folder to write, not a link to one")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    markers = ("log.csv", "snapshots", "checkpoint", "train_state.pt")  # a run, a resumable state
    run = [n for n in markers if (out / n).exists() or (out / n).is_symlink()]
    if run:
        raise ValueError(
            f"--out {out} holds a training run or its checkpoint ({', '.join(run)}): writing"
            " there would replace all of it; give a new folder"
        )
    if not overwrite:
        raise ValueError(
            f"--out {out} exists and is not empty: everything in it would be replaced; give a"
            " new folder, or --overwrite to replace it"
        )


def _load_lm(
    path: str, device: torch.device | None = None, precision: Precision | None = None
) -> tuple[DecoderLM, Tokenizer, GenerationIds]:
    """A decoder-only model, its tokenizer and its BOS / PAD / EOS ids (generation_config.json
    of a Hugging Face folder; none for a model aiayn trained)."""
    model, bundle = _load_as(path, DecoderLM, "a decoder-only language model", device, precision)
    return model, bundle.tokenizer, generation_of(bundle.run)


def _sampling(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
    )


def _load_encoder(path: str, device: torch.device) -> tuple[EncoderLM, Tokenizer]:
    """An encoder (BERT) and its tokenizer."""
    model, bundle = _load_as(path, EncoderLM, "an encoder (BERT)", device)
    return model, bundle.tokenizer


def _print_result(result: FitResult) -> None:
    if result.already_complete:
        print(
            f"the run is already complete: step {result.step} of {result.max_steps};"
            f" validation loss {result.val_loss:.4f} nats/token; checkpoint {result.checkpoint}"
        )
        return
    padding = result.padding_fraction
    print(
        f"step {result.step} of {result.max_steps}: validation loss {result.val_loss:.4f}"
        f" nats/token (final model); {result.tokens_per_s:,.0f} target tokens/s"
        + (f"; padding {padding:.1%} of batch slots" if padding is not None else "")
        + f"; peak memory {result.peak_rss_mib:,.0f} MiB; checkpoint {result.checkpoint}"
    )
    if result.skipped_steps:
        print(f"updates skipped (loss not finite) at steps {result.skipped_steps}")


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", default=None, help="auto (a GPU when there is one), cpu, cuda or cuda:N"
    )


def _add_precision(p: argparse.ArgumentParser) -> None:
    """The precision a command decodes in (aiayn/models/precision.py)."""
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="weights and activations (auto: the device's: bf16 on a GPU, fp32 on"
                   " a CPU); bfloat16 halves what a CPU with bf16 units reads per token")  # fmt: skip
    p.add_argument("--quantize", choices=("int8",), default=None,
                   help="int8 linear weights (one scale per output channel): a quarter of"
                   " fp32's bytes per token; a checkpoint already in int8 needs no flag")  # fmt: skip
    p.add_argument("--kv-cache-dtype", choices=("float32", "bfloat16"), default=None,
                   help="keep keys and values in this dtype (default: the model's)")  # fmt: skip


def _precision(args: argparse.Namespace) -> Precision:
    return Precision(dtype=args.dtype, quantize=args.quantize, kv_cache=args.kv_cache_dtype)


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, default=4, help="beam size (§6.1: 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty (§6.1: 0.6)")
    p.add_argument("--max-extra", type=int, default=50, help="output length <= input + this")
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of beam search")


def _add_set(p: argparse.ArgumentParser, metavar: str, help_: str) -> None:
    """``--set A=1 B=2``, repeatable: every occurrence counts (argparse's default keeps only
    the last)."""
    p.add_argument("--set", nargs="*", action="extend", default=[], metavar=metavar, help=help_)
