"""Commands about models and their folders: presets, info, calc, convert, average."""

from __future__ import annotations

import argparse

from aiayn.cli.common import _add_set, _check_out, _overrides
from aiayn.config import presets
from aiayn.errors import UserError

# The model_type of each family in aiayn/interop/families.py (named here, not imported, so
# that the parser needs no torch; tests/test_cli.py holds the two equal).
HF_FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "mixtral", "bert", "marian", "bart")


def cmd_presets(args: argparse.Namespace) -> int:
    import torch

    from aiayn.models import build_model

    with torch.device("meta"):
        for name in presets():
            model = build_model(name)
            print(f"{name:<20} {model.config.arch:<16} {model.num_parameters():>14,} parameters")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import torch

    from aiayn.inspect.summary import summarize
    from aiayn.models import build_model

    with torch.device("meta"):  # shapes only: no memory, no time
        model = build_model(args.preset, **_overrides(args.set))
    print(summarize(model))
    return 0


def cmd_calc(args: argparse.Namespace) -> int:
    """Parameters, FLOPs and memory from the config alone (nothing is built)."""
    from aiayn.inspect.cost_report import cost_report, format_cost_report, resolve_calc_config

    name, config = resolve_calc_config(args.model, _overrides(args.set))
    report = cost_report(config, args.context, args.batch, args.dtype, name=name)
    print(report.to_json() if args.json else format_cost_report(report))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Hugging Face checkpoint folders in (--from-hf) and out (--to-hf FAMILY); a checkpoint
    with int8 weights (--quantize int8)."""
    from aiayn.checkpoint import load
    from aiayn.checkpoint.loader import convert_from_hf
    from aiayn.data.tokenizer import BPETokenizer
    from aiayn.interop.hf_folder import save_hf_folder
    from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM

    _check_out(args.out, args.overwrite)
    if args.from_hf:
        path = convert_from_hf(args.from_hf, args.out)
        print(f"wrote the aiayn checkpoint {path}")
        return 0
    if not args.checkpoint:
        raise UserError(f"{'--quantize' if args.quantize else '--to-hf'} needs --checkpoint")
    bundle = load(args.checkpoint)
    if args.quantize:  # an aiayn checkpoint with int8 weights (aiayn/nn/quantized.py)
        from aiayn.checkpoint import save_bundle
        from aiayn.nn.quantized import quantize

        if bundle.model.config.quantization == "int8":
            raise UserError(f"{args.checkpoint} is already quantized to int8")
        model = quantize(bundle.model.float())
        path = save_bundle(args.out, model, bundle.tokenizer, bundle.run)  # type: ignore[arg-type]
        print(f"wrote the int8 checkpoint {path}")
        return 0
    if not isinstance(bundle.model, DecoderLM | EncoderLM | EncoderDecoder):
        raise UserError(f"{args.checkpoint}: a {type(bundle.model).__name__} has no HF layout")
    tok = bundle.tokenizer if isinstance(bundle.tokenizer, BPETokenizer) else None
    path = save_hf_folder(bundle.model, args.out, args.to_hf, tokenizer=tok)
    print(f"wrote the Hugging Face folder {path}")
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from aiayn.training.average import write_average

    _check_out(args.out, args.overwrite)
    write_average(args.checkpoints, args.out)
    print(f"averaged {len(args.checkpoints)} checkpoints into {args.out}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register presets, info, calc, convert, average."""
    p = sub.add_parser("presets", help="list the model presets and their sizes")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("info", help="summarise a preset (with overrides)")
    p.add_argument("preset", help=f"one of: {', '.join(presets())}")
    _add_set(p, "FIELD=VALUE", "config overrides")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("calc", help="parameters, FLOPs and memory of a config, without building it")
    p.add_argument(
        "model",
        help=f"a preset ({', '.join(presets())}), a config JSON file or a saved model folder",
    )
    _add_set(p, "FIELD=VALUE", "config overrides")
    p.add_argument(
        "--context", type=int, default=None, help="tokens per sequence (default: max_len)"
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument(
        "--dtype", default="bf16", help="float32/fp32, bfloat16/bf16, float16/fp16, int8, fp8"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_calc)

    p = sub.add_parser("average", help="average model checkpoints (§6.1)")
    p.add_argument("checkpoints", nargs="+", help="model folders with one config")
    p.add_argument("--out", required=True, help="a new folder (an existing one: --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.set_defaults(func=cmd_average)

    p = sub.add_parser("convert", help="Hugging Face checkpoint folders in and out")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from-hf", metavar="DIR", help="an HF folder (config.json, safetensors)")
    way.add_argument(
        "--to-hf",
        metavar="FAMILY",
        choices=HF_FAMILIES,
        help=f"write --checkpoint as this HF family ({', '.join(HF_FAMILIES)})",
    )
    way.add_argument(
        "--quantize",
        choices=("int8",),
        help="write --checkpoint (aiayn's or a Hugging Face folder) with int8 linear weights:"
        " it loads and decodes as it is, without quantizing again",
    )
    p.add_argument(
        "--checkpoint", help="the checkpoint or run folder to export (--to-hf) or quantize"
    )
    p.add_argument(
        "--out", required=True, help="the folder to write (an existing one: --overwrite)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.set_defaults(func=cmd_convert)
