"""Commands that decode: generate, chat, translate, embed, fill-mask."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from aiayn.cli.common import _add_decoding, _add_device, _add_precision
from aiayn.data.files import read_text, split_lines
from aiayn.errors import UserError


def cmd_generate(args: argparse.Namespace) -> int:
    """Continue a prompt, streaming whole characters; stop at the checkpoint's EOS ids
    (unless --ignore-eos), which are not printed."""
    import torch

    from aiayn.cli.loading import _device, _load_lm, _precision
    from aiayn.generate.threads import decode_threads

    model, tokenizer, ids = _load_lm(args.checkpoint, _device(args), _precision(args))
    threads = torch.get_num_threads()
    torch.set_num_threads(decode_threads(args.threads, model, 1))
    try:
        return _generate(args, model, tokenizer, ids)
    finally:
        torch.set_num_threads(threads)


def _generate(args: argparse.Namespace, model: Any, tokenizer: Any, ids: Any) -> int:
    import torch

    from aiayn.cli.loading import _sampling
    from aiayn.generate import generate
    from aiayn.generate.captured import capture_seconds
    from aiayn.generate.text import TextStream

    eos = () if args.ignore_eos else ids.eos
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise UserError("the prompt is empty: give at least one character")
    sys.stdout.write(args.prompt)
    text = TextStream(tokenizer.decode, prompt_ids)

    times: list[float] = []

    def show(token: torch.Tensor) -> None:
        times.append(time.perf_counter())
        if int(token[0]) not in eos:
            sys.stdout.write(text.add(int(token[0])))
            sys.stdout.flush()

    before = capture_seconds(model)
    start = time.perf_counter()
    generate(
        model,
        [prompt_ids],
        max_new_tokens=args.max_new_tokens,
        sampling=_sampling(args),
        seed=args.seed,
        eos_id=eos,
        stop=args.stop or (),
        decode=tokenizer.decode,
        truncate=args.truncate,
        on_token=show,
        compile=args.compile,
    )
    sys.stdout.write(text.rest() + "\n")
    if args.timing:
        made = {k: s for k, s in capture_seconds(model).items() if k not in before}
        _report_timing(start, times, list(made.values()))
    return 0


def _report_timing(start: float, times: list[float], captures: list[float]) -> None:
    """Time to the first token, and to each later one, on stderr (``--timing``).  A capture
    made during the run is the first step after the first token: its seconds (the step's
    own included) are reported on their own and left out of the time a token."""
    import torch

    line = f"first token {1e3 * (times[0] - start):.0f} ms"
    steps = len(times) - 1 - len(captures)  # a capture's seconds hold its step's too
    if steps > 0:
        steady = times[-1] - times[0] - sum(captures)
        line += f"; then {1e3 * steady / steps:.2f} ms a token"
    line += f"; {torch.get_num_threads()} threads"
    if captures:
        line += "; step captured in " + ", ".join(f"{s:.1f} s" for s in captures)
    print(line, file=sys.stderr)


def cmd_chat(args: argparse.Namespace) -> int:
    """An interactive chat in the terminal: one line per user message, the reply streamed.
    ``/reset`` starts again, ``/exit`` (or end of input) leaves."""
    from aiayn.cli.loading import _device, _load_lm, _precision, _sampling
    from aiayn.data.tokenizer import BPETokenizer
    from aiayn.generate.chat import Chat

    model, tokenizer, ids = _load_lm(args.checkpoint, _device(args), _precision(args))
    if not isinstance(tokenizer, BPETokenizer):
        raise UserError(f"{args.checkpoint}: a chat needs a Hugging Face tokenizer with a template")
    chat = Chat(
        model,
        tokenizer,
        ids,
        sampling=_sampling(args),
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        system=args.system,
    )
    prompt = "you> " if sys.stdin.isatty() else ""
    while True:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            chat.reset()
            continue
        if not line.strip():
            continue
        sys.stdout.write("assistant> " if prompt else "")
        try:
            for piece in chat.reply(line.rstrip("\n")):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except UserError as err:  # the conversation outgrew the model: say so, go on
            sys.stdout.write(f"[{err}]")
        sys.stdout.write("\n")


def cmd_translate(args: argparse.Namespace) -> int:
    import torch

    from aiayn.cli.loading import _beam, _device, _load_translator, _precision
    from aiayn.generate.threads import decode_threads
    from aiayn.generate.translate import translate

    model, tokenizer, ids = _load_translator(args.checkpoint, _device(args), _precision(args))
    text_in = read_text(args.input) if args.input else sys.stdin.read()
    lines = split_lines(text_in)
    beam = _beam(args)
    rows = min(args.batch_size, max(len(lines), 1)) * (1 if beam is None else beam.beam_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(decode_threads(args.threads, model, rows))
    try:
        out = translate(
            model,
            tokenizer,
            lines,
            beam=beam,
            batch_size=args.batch_size,
            truncate=args.truncate,
            generation=ids,
            compile=args.compile,
        )
    finally:
        torch.set_num_threads(threads)
    text = "".join(f"{line}\n" for line in out)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def cmd_embed(args: argparse.Namespace) -> int:
    """Sentence embeddings of lines (stdin or --file) to .npy or JSON lines."""
    import json

    import numpy as np

    from aiayn.cli.loading import _device, _load_encoder
    from aiayn.generate.encoder import sentence_embeddings
    from aiayn.interop.sentence_transformers import read_pooling

    model, tokenizer = _load_encoder(args.checkpoint, _device(args))
    pooling = read_pooling(args.checkpoint)  # a sentence-transformers folder's own recipe
    source = read_text(args.file) if args.file else sys.stdin.read()
    lines = split_lines(source)
    vectors = sentence_embeddings(
        model,
        tokenizer,
        lines,
        batch_size=args.batch_size,
        pooling=pooling,
        truncate=args.truncate,
    ).numpy()
    if args.out and args.out.endswith(".npy"):
        np.save(args.out, vectors)
        print(f"wrote {len(lines)} embeddings of {vectors.shape[1]} to {args.out}", file=sys.stderr)
        return 0
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    try:
        for line, v in zip(lines, vectors, strict=True):
            out.write(
                json.dumps({"text": line, "embedding": [round(float(x), 7) for x in v]}) + "\n"
            )
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def cmd_fill_mask(args: argparse.Namespace) -> int:
    """The likeliest tokens at each [MASK] of a text."""
    import json

    from aiayn.cli.loading import _device, _load_encoder
    from aiayn.generate.encoder import fill_mask

    model, tokenizer = _load_encoder(args.checkpoint, _device(args))
    if model.head is None:
        raise UserError(
            f"{args.checkpoint} has no masked-LM head (a BertModel): fill-mask needs the weights"
            " of a BertForMaskedLM or BertForPreTraining"
        )
    guesses = fill_mask(model, tokenizer, args.text, top_k=args.top_k)
    if args.json:
        print(json.dumps([[g.__dict__ for g in mask] for mask in guesses]))
        return 0
    for n, mask in enumerate(guesses, 1):
        print(f"mask {n}:")
        for g in mask:
            print(f"  {g.score:7.4f}  {g.token}")
    return 0


def _add_step_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="capture the decoding step with torch.compile (auto: for a job of at least 1,024"
        " steps, on CUDA, and on a CPU for steps of up to 8 rows, where it measured faster;"
        " cached on disk after the first run)",
    )
    p.add_argument(
        "--threads",
        default="auto",
        help="threads for decoding: a count, or auto (one for a small step, else every core)",
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register generate, chat, translate, embed, fill-mask."""
    for add in (_add_generate, _add_chat, _add_translate, _add_embed, _add_fill_mask):
        add(sub)


def _add_generate(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument(
        "--ignore-eos", action="store_true", help="go on past the checkpoint's end-of-text ids"
    )
    _add_step_options(p)
    p.add_argument(
        "--timing", action="store_true", help="print the time to the first token on stderr"
    )
    _add_device(p)
    _add_precision(p)
    p.set_defaults(func=cmd_generate)


def _add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="talk to a chat model in the terminal (its chat template)")
    p.add_argument("--checkpoint", required=True, help="a folder with a chat_template")
    p.add_argument("--system", default=None, help="a system message opening the conversation")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    _add_device(p)
    _add_precision(p)
    p.set_defaults(func=cmd_chat)


def _add_translate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate lines (stdin -> stdout, or files)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--input", default=None, help="file to translate (default: stdin)")
    p.add_argument("--output", default=None, help="where to write (default: stdout)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--truncate", action="store_true", help="cut over-long lines instead of failing")
    _add_step_options(p)
    _add_decoding(p)
    _add_device(p)
    _add_precision(p)
    p.set_defaults(func=cmd_translate)


def _add_embed(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "embed", help="sentence embeddings from an encoder (BERT), pooled as the folder says"
    )
    p.add_argument("--checkpoint", required=True, help="an aiayn or Hugging Face BERT folder")
    p.add_argument("--file", default=None, help="one text per line (default: stdin)")
    p.add_argument("--out", default=None, help="PATH.npy, or JSON lines (default: stdout)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--truncate", action="store_true", help="keep the start of over-long texts")
    _add_device(p)
    p.set_defaults(func=cmd_embed)


def _add_fill_mask(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fill-mask", help="the likeliest tokens at each [MASK] of a text (BERT)")
    p.add_argument("text", help='e.g. "Paris is the [MASK] of France."')
    p.add_argument("--checkpoint", required=True, help="an aiayn or Hugging Face BERT folder")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--json", action="store_true")
    _add_device(p)
    p.set_defaults(func=cmd_fill_mask)
