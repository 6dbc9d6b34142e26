"""Encoding a corpus in chunks on worker processes (``aiayn preprocess``): the corpus is cut
into chunks of whole lines, each worker encodes its chunk with the tokenizer and saves a part
file, and aiayn/data/preprocess.py assembles the parts into shards."""

from __future__ import annotations

import json
import multiprocessing
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.data.lines import decode, line_bytes, paired_lines
from aiayn.data.tokenizer import BPETokenizer, load_tokenizer


@dataclass(frozen=True)
class PairFiles:
    """Two line-aligned files: line i of ``source`` translates to line i of ``target``."""

    source: Path
    target: Path


@dataclass(frozen=True)
class BadLine:
    file: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.file}, line {self.line}: {self.reason}"


# --- the worker processes -------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_json: str, parts: str, max_len: int | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        path.write_text(tokenizer_json)
        _WORKER["tokenizer"] = load_tokenizer(path)
    _WORKER["parts"], _WORKER["max_len"] = Path(parts), max_len


def _encode_lines(texts: list[str]) -> list[list[int]]:
    tok = _WORKER["tokenizer"]
    if isinstance(tok, BPETokenizer):
        return [list(e.ids) for e in tok.tok.encode_batch(texts)]
    return [tok.encode(t) for t in texts]


def _save_part(name: str, arrays: dict[str, np.ndarray], stats: dict[str, Any]) -> None:
    """Write a part file atomically (a temporary name, then a rename)."""
    parts: Path = _WORKER["parts"]
    tmp = parts / f".{name}.tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, stats=np.array(json.dumps(stats)), **arrays)  # type: ignore[arg-type]
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, parts / name)


def _flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter((i for r in rows for i in r), dtype=np.int64, count=int(lengths.sum()))
    return flat, lengths


def encode_pair_chunk(job: tuple[str, int, str, str, list[bytes], list[bytes]]) -> str:
    """Check, encode and save one chunk of pairs (in a worker).  ``job``: the part's name,
    the first line's number, the two files' names, the two sides' raw lines."""
    name, first, src_file, tgt_file, src_raw, tgt_raw = job
    bad: list[BadLine] = []
    blank = 0
    lines: list[int] = []  # the line number of each pair that passes the text checks
    texts: tuple[list[str], list[str]] = ([], [])
    for n, (s_raw, t_raw) in enumerate(zip(src_raw, tgt_raw, strict=True), first):
        s, t = decode(s_raw), decode(t_raw)
        if s is None or t is None:
            bad.append(BadLine(src_file if s is None else tgt_file, n, "not UTF-8"))
        elif not s.strip() and not t.strip():
            blank += 1
        elif not s.strip() or not t.strip():
            bad.append(BadLine(src_file if not s.strip() else tgt_file, n, "empty on one side"))
        else:
            lines.append(n)
            texts[0].append(s)
            texts[1].append(t)
    src_ids, tgt_ids = _encode_lines(texts[0]), _encode_lines(texts[1])
    max_len = _WORKER["max_len"]
    if max_len is not None:  # the source gains EOS, the target BOS and EOS
        keep = [
            max(len(a) + 1, len(b) + 2) <= max_len for a, b in zip(src_ids, tgt_ids, strict=True)
        ]
        for n, a, b, k in zip(lines, src_ids, tgt_ids, keep, strict=True):
            if not k:
                why = f"{len(a)} source and {len(b)} target tokens: over max_len={max_len}"
                bad.append(BadLine(src_file, n, why))
        src_ids = [r for r, k in zip(src_ids, keep, strict=True) if k]
        tgt_ids = [r for r, k in zip(tgt_ids, keep, strict=True) if k]
    bad.sort(key=lambda b: b.line)
    s_flat, s_len = _flat(src_ids)
    t_flat, t_len = _flat(tgt_ids)
    stats = {"pairs": len(src_ids), "blank": blank, "bad": [asdict(b) for b in bad]}
    arrays = {"source": s_flat, "source_len": s_len, "target": t_flat, "target_len": t_len}
    _save_part(name, arrays, stats)
    return name


def encode_text_chunk(job: tuple[str, int, str, list[bytes]]) -> str:
    """Decode, encode and save one chunk of a language model's text (in a worker)."""
    name, first, file, raw = job
    bad, texts = [], []
    for n, line in enumerate(raw, first):
        text = decode(line)
        if text is None:
            bad.append(BadLine(file, n, "not UTF-8"))
        else:
            texts.append(text)
    ids = _WORKER["tokenizer"].encode("".join(texts))
    stats = {"lines": len(raw), "bad": [asdict(b) for b in bad]}
    _save_part(name, {"text": np.asarray(ids, dtype=np.int64)}, stats)
    return name


# --- reading the corpus in chunks -----------------------------------------------------------


def pair_chunks(
    split: str, files: list[PairFiles], size: int
) -> Iterator[tuple[str, int, str, str, list[bytes], list[bytes]]]:
    for j, pair in enumerate(files):
        src: list[bytes] = []
        tgt: list[bytes] = []
        first, k = 1, 0
        for n, (s, t) in enumerate(paired_lines(pair.source, pair.target), 1):
            src.append(s)
            tgt.append(t)
            if len(src) == size:
                yield (
                    f"{split}-{j:03d}-{k:06d}.npz",
                    first,
                    str(pair.source),
                    str(pair.target),
                    src,
                    tgt,
                )
                src, tgt, first, k = [], [], n + 1, k + 1
        if src:
            yield (
                f"{split}-{j:03d}-{k:06d}.npz",
                first,
                str(pair.source),
                str(pair.target),
                src,
                tgt,
            )


def _cut_before(previous: bytes, line: bytes) -> int | None:
    """Where a chunk may end between two lines so that its ids are those of the whole text:
    the length of ``previous`` to keep in this chunk (the rest goes to the next), or None.

    The byte-level BPE's pre-tokenizer (GPT-2's pattern) joins a run of white space to what
    follows it, and at the end of a text keeps the run whole: ``"x \n" + "b"`` is ``" "``,
    ``"\n"``, ``"b"``, but ``"x \n"`` alone ends in ``" \n"``.  A cut is exact only where a
    single white-space character, after a non-space one, meets a non-space one: after the
    ``\n`` of ``"...x\n"``, or between the ``\r`` and ``\n`` of ``"...x\r\n"``, before a
    line that starts with a non-space character."""
    if not line[:1] or line[:1].isspace():
        return None
    if previous.endswith(b"\r\n") and previous[-3:-2] and not previous[-3:-2].isspace():
        return len(previous) - 1  # "...x\r" | "\n" + line
    if previous.endswith(b"\n") and previous[-2:-1] and not previous[-2:-1].isspace():
        return len(previous)
    return None


def text_chunks(path: Path, size: int) -> Iterator[tuple[str, int, str, list[bytes]]]:
    """Chunks of lines (with their endings) of at least ``size`` bytes, cut only where
    ``_cut_before`` allows, so that the chunks encode to the ids of the whole text.  A
    chunk's first line number is that of its first line (a ``\n`` carried over from a
    ``\r\n`` joins the next line)."""
    lines: list[bytes] = []
    nbytes, first, k = 0, 1, 0
    for n, line in enumerate(line_bytes(path, keep_ends=True), 1):
        cut = _cut_before(lines[-1], line) if nbytes >= size and lines else None
        if cut is not None:
            carry = lines[-1][cut:]
            lines[-1] = lines[-1][:cut]
            yield f"text-{k:06d}.npz", first, str(path), lines
            lines, nbytes, first, k = [], 0, n, k + 1
            line = carry + line
        lines.append(line)
        nbytes += len(line)
    if lines:
        yield f"text-{k:06d}.npz", first, str(path), lines


def run_chunks(
    jobs: Iterable[tuple[Any, ...]],
    fn: Callable[[Any], str],
    done: Callable[[str], bool],
    workers: int,
    init_args: tuple[Any, ...],
) -> int:
    """Run ``fn`` on every job whose part is not ``done`` yet, on ``workers`` processes (in
    this one for 1), with at most two jobs per worker in flight.  Returns the jobs run."""
    count = 0
    if workers <= 1:
        _init_worker(*init_args)
        for job in jobs:
            if not done(job[0]):
                fn(job)
                count += 1
        return count
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that ran Rust threads
    with ctx.Pool(workers, initializer=_init_worker, initargs=init_args) as pool:
        pending: deque[Any] = deque()
        for job in jobs:
            if done(job[0]):
                continue
            pending.append(pool.apply_async(fn, (job,)))
            count += 1
            if len(pending) >= 2 * workers:
                pending.popleft().get()
        while pending:
            pending.popleft().get()
    return count
