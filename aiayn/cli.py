"""The ``aiayn`` command.  Thin: every subcommand is a call into the library."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import torch

from aiayn.config import presets
from aiayn.data.bpe import BOS, EOS, train_bpe
from aiayn.data.files import data_dir, read_lines
from aiayn.inspect.summary import summarize
from aiayn.models import EncoderDecoder, build_model


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


def cmd_presets(args: argparse.Namespace) -> int:
    with torch.device("meta"):
        for name in presets():
            model = build_model(name)
            print(f"{name:<20} {model.config.arch:<16} {model.num_parameters():>14,} parameters")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    with torch.device("meta"):  # shapes only: no memory, no time
        model = build_model(args.preset, **_overrides(args.set))
    print(summarize(model))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Build the paper's model and run it on a real Multi30k sentence."""
    torch.manual_seed(args.seed)
    root = data_dir(args.data) / "multi30k"
    print(f"data: {root}")
    t0 = time.perf_counter()
    de = read_lines(root / "train.de.gz")
    en = read_lines(root / "train.en.gz")
    tokenizer = train_bpe(de + en, vocab_size=args.vocab_size)
    print(
        f"shared BPE vocabulary (§5.1) of {tokenizer.get_vocab_size():,} tokens trained on"
        f" {len(de):,} German-English pairs in {time.perf_counter() - t0:.1f}s"
    )
    with torch.device("meta"):
        paper = build_model("paper-base")
    print(
        f"paper-base with the paper's 37,000-token vocabulary: {paper.num_parameters():,} parameters"
    )

    model = build_model("paper-base", vocab_size=tokenizer.get_vocab_size()).eval()
    assert isinstance(model, EncoderDecoder)
    print(summarize(model))

    source = read_lines(root / "test_2016_flickr.de.gz")[0]
    reference = read_lines(root / "test_2016_flickr.en.gz")[0]
    src_ids = [*tokenizer.encode(source).ids, EOS]
    tgt_ids = [BOS, *tokenizer.encode(reference).ids]
    print(f"\nsource    : {source}\n  {len(src_ids)} tokens: {tokenizer.encode(source).tokens}")
    print(f"reference : {reference}\n  {len(tgt_ids)} tokens (with <s>)")
    src, tgt = torch.tensor([src_ids]), torch.tensor([tgt_ids])
    with torch.no_grad():
        t0 = time.perf_counter()
        logits, weights = model.forward_with_weights(src, tgt)
        elapsed = time.perf_counter() - t0
    probs = logits.softmax(-1)
    nll = -probs[0, :-1].gather(-1, tgt[0, 1:, None]).log().mean()
    print(
        f"\nforward pass: logits {tuple(logits.shape)} in {elapsed * 1000:.0f} ms;"
        f" encoder self-attention {tuple(weights['encoder'][0].shape)},"
        f" decoder self-attention {tuple(weights['decoder'][0].shape)},"
        f" cross-attention {tuple(weights['cross'][0].shape)}"
    )
    print(
        f"untrained: mean -log p(reference) = {nll.item():.2f} nats per token"
        f" (uniform would be ln {tokenizer.get_vocab_size()} = {torch.log(torch.tensor(float(tokenizer.get_vocab_size()))).item():.2f})"
    )
    cross = weights["cross"][-1][0].mean(0)  # (T, S), averaged over heads
    print(
        "  (worse than uniform: with tied embeddings an untrained model mostly predicts the"
        " token it was given; training fixes that)"
    )
    print(f"last layer cross-attention, rows sum to {cross.sum(-1).mean().item():.3f}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiayn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("presets", help="list the model presets and their sizes")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("info", help="summarise a preset (with overrides)")
    p.add_argument("preset", help=f"one of: {', '.join(presets())}")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="config overrides")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", help="build the paper's model and run it on a Multi30k sentence")
    p.add_argument(
        "--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)"
    )
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as err:
        print(f"aiayn: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
