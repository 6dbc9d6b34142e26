"""Library objects from a command's arguments: devices, precisions, decoding settings and
the checkpoints each command loads.  Imported by the commands when they run, never by the
parsers."""

from __future__ import annotations

import argparse
from typing import TypeVar

import torch

from aiayn.checkpoint import Bundle, load
from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer, Tokenizer
from aiayn.errors import UserError
from aiayn.generate.beam import BeamConfig
from aiayn.generate.sampling import SamplingConfig
from aiayn.interop.generation_config import GenerationIds, generation_of
from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM, TransformerModel
from aiayn.models.precision import Precision, apply_precision
from aiayn.training.loop import FitResult

M = TypeVar("M", bound=TransformerModel)


def _beam(args: argparse.Namespace) -> BeamConfig | None:
    if args.greedy:
        return None
    return BeamConfig(beam_size=args.beam, length_penalty=args.alpha, max_extra=args.max_extra)


def _device(args: argparse.Namespace) -> torch.device:
    from aiayn.device import resolve_device

    return resolve_device(getattr(args, "device", "auto") or "auto")


def _load_as(
    path: str,
    kind: type[M],
    what: str,
    device: torch.device | None,
    precision: Precision | None = None,
) -> tuple[M, Bundle]:
    """The model of the checkpoint, run or Hugging Face folder ``path``
    (``aiayn.checkpoint.load``), which must be a ``kind`` (``what`` names it in the
    error), in evaluation mode and, given a ``device``, ready for inference there in
    ``precision`` (the device's dtype by default); and its bundle."""
    bundle = load(path)
    model = bundle.model
    if not isinstance(model, kind):
        raise UserError(f"{path} holds a {type(model).__name__}, not {what}")
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
        raise UserError(f"{path} is not a translation checkpoint (an encoder-decoder with BPE)")
    return model, bundle.tokenizer, generation_of(bundle.run)


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


def _precision(args: argparse.Namespace) -> Precision:
    return Precision(dtype=args.dtype, quantize=args.quantize, kv_cache=args.kv_cache_dtype)
