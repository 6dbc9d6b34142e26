"""Shared by the commands' parsers: argument groups, ``--set`` overrides, output folders.

It imports no torch: every parser of ``aiayn`` is built from it, so that ``aiayn --help`` is
quick; what builds library objects from the arguments is in ``aiayn.cli.loading``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from aiayn.errors import UserError


def _overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``key=value`` pairs; values parsed as int, float, bool or None when they look like one."""
    out: dict[str, object] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UserError(f"override {pair!r} is not of the form field=value")
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


def _check_out(path: str, overwrite: bool) -> None:
    """``--out`` of a command that writes one whole folder, replacing what is there: a new or
    empty folder, or with ``--overwrite`` an existing one -- but never a link (a run's
    ``checkpoint`` link) or a training run, whose other files would go with it."""
    out = Path(path)
    if out.is_symlink():
        raise UserError(f"--out {out} is a link; give the folder to write, not a link to one")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    markers = ("log.csv", "snapshots", "checkpoint", "train_state.pt")  # a run, a resumable state
    run = [n for n in markers if (out / n).exists() or (out / n).is_symlink()]
    if run:
        raise UserError(
            f"--out {out} holds a training run or its checkpoint ({', '.join(run)}): writing"
            " there would replace all of it; give a new folder"
        )
    if not overwrite:
        raise UserError(
            f"--out {out} exists and is not empty: everything in it would be replaced; give a"
            " new folder, or --overwrite to replace it"
        )


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", default=None, help="auto (a GPU when there is one), cpu, cuda or cuda:N"
    )


def _add_precision(p: argparse.ArgumentParser) -> None:
    """The precision a command decodes in (aiayn/models/precision.py)."""
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="weights and activations (auto: the device's: bf16 on a GPU, fp32 on"
        " a CPU); bfloat16 halves what a CPU with bf16 units reads per token",
    )
    p.add_argument(
        "--quantize",
        choices=("int8",),
        default=None,
        help="int8 linear weights (one scale per output channel): a quarter of"
        " fp32's bytes per token; a checkpoint already in int8 needs no flag",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="keep keys and values in this dtype (default: the model's)",
    )


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, default=4, help="beam size (§6.1: 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty (§6.1: 0.6)")
    p.add_argument("--max-extra", type=int, default=50, help="output length <= input + this")
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of beam search")


def _add_set(p: argparse.ArgumentParser, metavar: str, help_: str) -> None:
    """``--set A=1 B=2``, repeatable: every occurrence counts (argparse's default keeps only
    the last)."""
    p.add_argument("--set", nargs="*", action="extend", default=[], metavar=metavar, help=help_)
