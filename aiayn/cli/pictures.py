"""``aiayn inspect``: attention maps, positional encodings, worked examples as figures."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiayn.cli.common import _add_set, _overrides
from aiayn.config import presets
from aiayn.errors import UserError


def cmd_inspect_attention(args: argparse.Namespace) -> int:
    """Attention maps of a checkpoint or an untrained preset on a piece of text, or of an image
    model on one of its test images."""
    from aiayn.inspect.attention_maps import attention_maps

    if args.image is not None:
        from aiayn.inspect.image_attention import image_attention

        if not args.checkpoint:
            raise UserError("--image needs --checkpoint (a trained image model)")
        path, numbers = image_attention(args.checkpoint, args.image, args.out, head=args.head)
        print(f"test image {args.image}: true {numbers['true']}, predicted {numbers['predicted']}")
        print(f"image    {path}")
        return 0
    if args.text is None:
        raise UserError("--text is required (or --image for an image model)")
    written = attention_maps(
        args.checkpoint or args.preset,
        args.text,
        args.out,
        layer=args.layer,
        head=args.head,
        target_text=args.target,
        overrides=_overrides(args.set),
    )
    for name, path in written.items():
        print(f"{name:<8} {path}")
    return 0


def cmd_inspect_positions(args: argparse.Namespace) -> int:
    """The sinusoidal table, one position's similarity to the others, RoPE's relative scores."""
    from aiayn.inspect import figures

    out = Path(args.out)
    paths = [
        figures.positional_encoding_image(
            args.max_len, args.d_model, out / "positional_encoding.png"
        ),
        figures.positional_similarity(
            args.max_len, args.d_model, args.position, out / "positional_similarity.png"
        ),
        figures.rope_relative_scores(
            args.d_model, max(1, args.max_len // 4), out / "rope_relative.png"
        ),
    ]
    for path in paths:
        print(path)
    return 0


def cmd_inspect_example(args: argparse.Namespace) -> int:
    """A worked example: print its numbers (computed by the library), write its figure."""
    from aiayn.inspect import worked_examples

    name = args.example
    path, numbers = worked_examples.EXAMPLES[name](
        Path(args.out) / f"example_{name.replace('-', '_')}.png"
    )
    print(worked_examples.format_numbers(numbers))
    print(f"figure: {path}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register inspect."""
    p = sub.add_parser("inspect", help="pictures: attention maps, positions, worked examples")
    inspect = p.add_subparsers(dest="what", required=True)
    q = inspect.add_parser(
        "attention", help="attention maps of a checkpoint or an untrained preset on a text"
    )
    model = q.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", help="a trained checkpoint folder")
    model.add_argument("--preset", help=f"an untrained preset: {', '.join(presets())}")
    q.add_argument("--text", default=None, help="the (source) text")
    q.add_argument(
        "--image", type=int, default=None, help="an image model: the index of a test image"
    )
    q.add_argument("--target", default=None, help="encoder-decoder target text (default: --text)")
    q.add_argument("--layer", type=int, default=None, help="one layer, from 0 (default: all)")
    q.add_argument("--head", type=int, default=None, help="one head of --layer, from 0")
    q.add_argument("--out", default="figures", help="folder for the PNGs (default: figures/)")
    _add_set(q, "FIELD=VALUE", "preset overrides")
    q.set_defaults(func=cmd_inspect_attention)
    q = inspect.add_parser("positions", help="sinusoidal encodings and RoPE's relative scores")
    q.add_argument("--max-len", type=int, default=128, help="positions to draw")
    q.add_argument("--d-model", type=int, default=64, help="encoding width (and RoPE head size)")
    q.add_argument("--position", type=int, default=20, help="position to compare with the rest")
    q.add_argument("--out", default="figures", help="folder for the PNGs (default: figures/)")
    q.set_defaults(func=cmd_inspect_positions)
    q = inspect.add_parser("example", help="a worked example: print the numbers, draw the figure")
    q.add_argument("example", choices=["trophy", "not-good", "scale", "paths", "nadaraya-watson"])
    q.add_argument("--out", default="figures", help="folder for the PNG (default: figures/)")
    q.set_defaults(func=cmd_inspect_example)
