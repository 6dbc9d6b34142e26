"""Commands: preprocess (a corpus into token shards), download (a corpus, checksummed)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aiayn.cli.common import _add_set, _overrides
from aiayn.data.files import data_dir
from aiayn.errors import UserError


def _tokenizer_from(path: str) -> Any:
    """A tokenizer file (aiayn's tokenizer.json), or the tokenizer of a checkpoint, run or
    Hugging Face folder."""
    from aiayn.checkpoint import load
    from aiayn.data.tokenizer import load_tokenizer

    p = Path(path)
    return load_tokenizer(p) if p.is_file() else load(p).tokenizer


def _from_config(args: argparse.Namespace) -> dict[str, Any]:
    """What a run's config says to preprocess: its files, tokenizer and max_len."""
    from aiayn.data.parallel import multi30k_file
    from aiayn.data.preprocess import PairFiles
    from aiayn.training.config import load_run_config

    run = load_run_config(args.config, _overrides(args.set))
    d, root = run.data, data_dir(args.data)
    given = args.tokenizer or run.init_from  # a fine-tuning run reads its folder's tokenizer
    tokenizer = _tokenizer_from(str(given)) if given else None
    if run.model.arch != "encoder-decoder":
        return {
            "text": root / d.text,
            "tokenizer_kind": d.tokenizer,
            "vocab_size": d.bpe_vocab_size,
            "tokenizer": tokenizer,
        }

    def pair(split: str, source: str | None, target: str | None) -> PairFiles:
        if source and target:
            return PairFiles(root / source, root / target)
        m30k = root / "multi30k"
        return PairFiles(
            multi30k_file(m30k, split, d.source_lang), multi30k_file(m30k, split, d.target_lang)
        )

    return {
        "train": [pair("train", d.train_source, d.train_target)],
        "valid": [pair("val", d.valid_source, d.valid_target)],
        "vocab_size": d.bpe_vocab_size,
        "max_len": run.model.max_len,
        "tokenizer": tokenizer,
    }


def _from_files(args: argparse.Namespace) -> dict[str, Any]:
    from aiayn.data.preprocess import PairFiles

    tokenizer = _tokenizer_from(args.tokenizer) if args.tokenizer else None
    if args.text:
        return {
            "text": Path(args.text),
            "tokenizer_kind": args.tokenizer_kind,
            "vocab_size": args.vocab_size,
            "tokenizer": tokenizer,
        }
    files = (args.source, args.target, args.valid_source, args.valid_target)
    if not all(files):
        raise UserError(
            "preprocess needs a run's config, --text FILE, or all four of --source --target"
            " --valid-source --valid-target"
        )
    return {
        "train": [PairFiles(Path(args.source), Path(args.target))],
        "valid": [PairFiles(Path(args.valid_source), Path(args.valid_target))],
        "vocab_size": args.vocab_size,
        "max_len": args.max_len,
        "tokenizer": tokenizer,
    }


def _report(result: Any) -> None:
    h = result.header
    print(f"wrote {result.out} in {result.seconds:.1f} s ({result.parts_run} parts encoded now)")
    print(f"  tokenizer: {h['tokenizer_kind']}, {h['vocab_size']:,} tokens, {h['dtype']} ids")
    if h["kind"] == "text":
        print(f"  text: {h['tokens']:,} tokens")
    for split, info in h.get("splits", {}).items():
        print(
            f"  {split}: {info['pairs']:,} pairs, {info['source']['tokens']:,} source and"
            f" {info['target']['tokens']:,} target tokens, longest {info['source']['longest']}"
            f" / {info['target']['longest']}"
        )
    bad = h["bad_lines"]
    if bad["counts"]:
        counts = ", ".join(f"{n:,} {why}" for why, n in bad["counts"].items())
        print(f"  left out: {counts}; the first of them:")
        for b in bad["first"][:10]:
            print(f"    {b['file']}, line {b['line']}: {b['reason']}")
    print(f'train from it with  [data] shards = "{Path(result.out).resolve()}"')


def cmd_preprocess(args: argparse.Namespace) -> int:
    from aiayn.data.preprocess import preprocess_parallel, preprocess_text

    spec = _from_config(args) if args.config else _from_files(args)
    common = {"workers": args.workers, "overwrite": args.overwrite}
    if "text" in spec:
        result = preprocess_text(spec.pop("text"), args.out, **spec, **common)
    else:
        result = preprocess_parallel(
            spec.pop("train"), spec.pop("valid"), args.out, **spec, **common
        )
    _report(result)
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from aiayn.data.download import prepare_wmt14_en_de

    counts = prepare_wmt14_en_de(args.out, cache=args.cache)
    for split, n in counts.items():
        print(f"{split}: {n:,} line pairs in {Path(args.out) / split}.{{en,de}}")
    print(f"next: aiayn preprocess configs/wmt14_en_de_base.toml --data {args.out} --out SHARDS")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register preprocess, download."""
    p = sub.add_parser(
        "preprocess",
        help="tokenize a corpus once into token shards that training maps (large corpora)",
        description="Tokenize a parallel corpus or a language model's text once, on every core,"
        " into token shards (a folder written atomically; a stopped run resumes). Give a run's"
        " config (its [data] files, tokenizer and max_len) or the files themselves.",
    )
    p.add_argument("config", nargs="?", help="a run's TOML config (what it trains on)")
    p.add_argument("--out", required=True, help="the shards folder to write")
    p.add_argument("--data", default=None, help="data folder of the config's relative paths")
    _add_set(p, "TABLE.FIELD=VALUE", "config overrides")
    p.add_argument("--source", help="training source file (plain, .gz or .xz)")
    p.add_argument("--target", help="training target file, line-aligned with --source")
    p.add_argument("--valid-source", help="validation source file")
    p.add_argument("--valid-target", help="validation target file")
    p.add_argument("--text", help="a language model's text file (instead of pairs)")
    p.add_argument("--tokenizer-kind", choices=("bpe", "char"), default="bpe", help="for --text")
    p.add_argument("--vocab-size", type=int, default=8000, help="BPE vocabulary to train")
    p.add_argument(
        "--max-len",
        type=int,
        default=256,
        help="leave out pairs longer than this many tokens (with BOS/EOS)",
    )
    p.add_argument(
        "--tokenizer",
        help="use this tokenizer (a tokenizer.json or a checkpoint folder) instead of training one",
    )
    p.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--overwrite", action="store_true", help="replace the folder at --out")
    p.set_defaults(func=cmd_preprocess)

    p = sub.add_parser(
        "download",
        help="download WMT14 English-German (the paper's 4.5M pairs), checksummed and resumable",
    )
    p.add_argument("dataset", choices=("wmt14-en-de",))
    p.add_argument("--out", required=True, help="folder for train/valid/test .en and .de")
    p.add_argument("--cache", default=None, help="where archives are kept (default ~/.cache/aiayn)")
    p.set_defaults(func=cmd_download)
