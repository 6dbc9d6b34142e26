"""The ``aiayn`` command.  Thin: every subcommand is a call into the library."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.config import presets
from aiayn.data.bpe import BOS, EOS, train_bpe
from aiayn.data.char import Tokenizer
from aiayn.data.files import data_dir, read_lines
from aiayn.inspect.summary import summarize
from aiayn.models import DecoderLM, EncoderDecoder, build_model


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


def cmd_calc(args: argparse.Namespace) -> int:
    """Parameters, FLOPs and memory from the config alone (nothing is built)."""
    from aiayn.inspect.calc import cost_report, format_cost_report, load_config

    name, config = load_config(args.model, _overrides(args.set))
    report = cost_report(config, args.context, args.batch, args.dtype, name=name)
    print(report.to_json() if args.json else format_cost_report(report))
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


def cmd_train(args: argparse.Namespace) -> int:
    from aiayn.train.config import load_run_config
    from aiayn.train.lm import train_lm

    run = load_run_config(args.config, _overrides(args.set))
    if run.model.arch != "decoder":
        raise ValueError(
            f"aiayn train runs decoder-only configs for now, got arch={run.model.arch!r}"
        )
    result = train_lm(run, args.out, data_dir(args.data), resume=args.resume)
    print(f"validation loss {result['val_loss']:.4f} nats/token; checkpoint {result['checkpoint']}")
    return 0


def _load_lm(path: str) -> tuple[DecoderLM, Tokenizer]:
    from aiayn.train.state import load_checkpoint

    model, tokenizer, _, _ = load_checkpoint(Path(path))
    if not isinstance(model, DecoderLM):
        raise ValueError(
            f"{path} holds a {type(model).__name__}, not a decoder-only language model"
        )
    return model.eval(), tokenizer


def cmd_generate(args: argparse.Namespace) -> int:
    from aiayn.generate import SamplingConfig, generate

    model, tokenizer = _load_lm(args.checkpoint)
    sampling = SamplingConfig(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
    )
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty: give at least one character")
    sys.stdout.write(args.prompt)
    text: list[int] = []

    def show(token: torch.Tensor) -> None:
        text.append(int(token[0]))
        sys.stdout.write(tokenizer.decode([text[-1]]))
        sys.stdout.flush()

    generate(
        model,
        [prompt_ids],
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        seed=args.seed,
        stop=args.stop or (),
        decode=tokenizer.decode,
        truncate=args.truncate,
        on_token=show,
    )
    sys.stdout.write("\n")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import math

    from aiayn.data.lm_data import TokenStream
    from aiayn.train.lm import evaluate_lm
    from aiayn.train.state import load_checkpoint

    model, tokenizer, run, _ = load_checkpoint(Path(args.checkpoint))
    data = run.get("data", {})
    text = args.text or data.get("text")
    if not text:
        raise ValueError("no text to evaluate on: pass --text FILE")
    path = Path(text) if Path(text).is_file() else data_dir(args.data) / text
    stream = TokenStream.from_file(path, tokenizer, train_fraction=data.get("train_fraction", 0.9))
    block = args.block or model.config.max_len
    loss = evaluate_lm(model, stream, batches=args.batches, batch_size=args.batch_size, block=block)  # type: ignore[arg-type]
    chars_per_token = 1.0 if getattr(tokenizer, "kind", "") == "char" else float("nan")
    print(f"validation loss    {loss:.4f} nats/token")
    print(f"perplexity         {math.exp(loss):.3f}")
    if chars_per_token == 1.0:
        print(f"bits per character {loss / math.log(2):.4f}")
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

    p = sub.add_parser("calc", help="parameters, FLOPs and memory of a config, without building it")
    p.add_argument(
        "model",
        help=f"a preset ({', '.join(presets())}), a config JSON file or a saved model folder",
    )
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="config overrides")
    p.add_argument(
        "--context", type=int, default=None, help="tokens per sequence (default: max_len)"
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument(
        "--dtype", default="bf16", help="float32/fp32, bfloat16/bf16, float16/fp16, int8, fp8"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_calc)

    p = sub.add_parser("demo", help="build the paper's model and run it on a Multi30k sentence")
    p.add_argument(
        "--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)"
    )
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a model from a TOML config (see configs/)")
    p.add_argument("config")
    p.add_argument("--out", default="runs/default", help="run folder: checkpoint/ and log.csv")
    p.add_argument(
        "--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)"
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument(
        "--set", nargs="*", default=[], metavar="TABLE.FIELD=VALUE", help="e.g. train.max_steps=100"
    )
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("generate", help="continue a prompt with a language model, streaming")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", help="stop once this text appears (repeatable)")
    p.add_argument("--truncate", action="store_true", help="keep the end of an over-long prompt")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("evaluate", help="validation loss, perplexity and bits per character")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", default=None)
    p.add_argument("--text", default=None, help="text file (default: the one the model trained on)")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--block", type=int, default=None)
    p.set_defaults(func=cmd_evaluate)
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
