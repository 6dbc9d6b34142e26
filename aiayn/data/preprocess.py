"""``aiayn preprocess``: tokenize a corpus once into token shards (aiayn/data/shards.py).

The paper trained on 4.5M sentence pairs (WMT14 English-German).  Reading such a corpus into
Python lists, training the BPE model and tokenizing every line at every start (and every
resume) costs minutes and gigabytes before the first step; nanoGPT's ``prepare.py``,
``fairseq-preprocess`` and Megatron's indexed datasets do it once.  So does this module:

1. **The tokenizer** is trained from an iterator over the training files (both sides of a
   parallel corpus, or a language model's text), streamed line by line -- never a list of
   the corpus -- or loaded from a tokenizer file.  Trained on the same lines, it equals the
   one ``aiayn train`` builds from plain files.
2. **Encoding** runs in chunks of lines on every core (a pool of worker processes): each
   chunk's ids are written to a part file of their own, atomically, so a stopped run resumes
   at the first missing part.  Memory is bounded by the chunks in flight.
3. **Bad lines** are left out and reported with their file and line number: a line that is
   not UTF-8, a pair empty on one side only, a pair longer than ``max_len`` tokens.  Pairs
   empty on both sides are skipped as ``aiayn train`` skips them.
4. **The shards folder** is assembled from the parts in order and written atomically (a
   temporary folder, a manifest with every file's SHA-256, one rename): there is never a
   half-written shards folder.  The work folder ``.NAME.work`` beside it is then removed.

Shapes: C pairs (or lines) per chunk.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.atomic import begin_folder, commit_folder, sha256_file
from aiayn.data import shards
from aiayn.data.encode_chunks import (
    PairFiles,
    encode_pair_chunk,
    encode_text_chunk,
    pair_chunks,
    run_chunks,
    text_chunks,
)
from aiayn.data.lines import decode, line_bytes, paired_lines
from aiayn.data.tokenizer import BPETokenizer, CharTokenizer, Tokenizer, load_tokenizer
from aiayn.errors import UserError

CHUNK_PAIRS = 32_768  # sentence pairs per part file
CHUNK_TEXT_BYTES = 4 << 20  # a language model's text per part file
MAX_REPORTED = 100  # bad lines named in the header (all are counted)
Log = Callable[[str], None]


def _file_identity(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"text file {path} does not exist")
    st = path.stat()
    return {"path": str(path.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """SHA-256 of a tokenizer's saved form (canonical JSON): what the shards were made with."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        tokenizer.save(path)
        data = json.loads(path.read_text())
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- the work folder: what a stopped run resumes from ---------------------------------------


class WorkDir:
    """``.NAME.work`` beside the shards folder: the settings and inputs it was started with,
    the tokenizer, and the part files.  Started again with other settings or inputs, it is
    emptied first."""

    def __init__(self, out: Path, spec: dict[str, Any], log: Log) -> None:
        self.path = out.parent / f".{out.name}.work"
        self.parts = self.path / "parts"
        spec_file = self.path / "spec.json"
        if self.path.exists():
            same = spec_file.is_file() and json.loads(spec_file.read_text()) == spec
            if same:
                log(f"resuming: {len(list(self.parts.glob('*.npz')))} parts already in {self.path}")
            else:
                log(f"{self.path} was started with other settings or inputs: starting again")
                shutil.rmtree(self.path)
        self.parts.mkdir(parents=True, exist_ok=True)
        if not spec_file.is_file():
            _write_atomically(spec_file, json.dumps(spec, indent=1))

    @property
    def tokenizer_file(self) -> Path:
        return self.path / "tokenizer.json"

    def tokenizer(self, make: Callable[[], Tokenizer]) -> Tokenizer:
        """The run's tokenizer: saved on the first run, read back on a resume."""
        if self.tokenizer_file.is_file():
            return load_tokenizer(self.tokenizer_file)
        tokenizer = make()
        tmp = self.tokenizer_file.with_suffix(".tmp")
        tokenizer.save(tmp)
        os.replace(tmp, self.tokenizer_file)
        return tokenizer

    def has(self, name: str) -> bool:
        return (self.parts / name).is_file()

    def load(self, name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        with np.load(self.parts / name) as z:
            arrays = {k: z[k] for k in z.files if k != "stats"}
            return arrays, json.loads(str(z["stats"]))


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- assembling the shards ------------------------------------------------------------------


class _Appender:
    """One side of a split: ids appended to ``.bin``, offsets to ``.idx``, lengths counted."""

    def __init__(self, folder: Path, split: str, side: str, dtype: np.dtype[Any]) -> None:
        # open across many parts' appends, closed by close() (or with the folder on failure)
        self.bin = open(folder / shards.bin_name(split, side), "wb")  # noqa: SIM115
        self.idx = open(folder / shards.idx_name(split, side), "wb")  # noqa: SIM115
        self.dtype, self.end, self.count = dtype, 0, 0
        self.histogram = np.zeros(1, dtype=np.int64)
        np.zeros(1, dtype=np.int64).tofile(self.idx)

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        flat.astype(self.dtype).tofile(self.bin)
        (self.end + np.cumsum(lengths)).astype(np.int64).tofile(self.idx)
        self.end += int(lengths.sum())
        self.count += len(lengths)
        if len(lengths):
            counts = np.bincount(lengths)
            if len(counts) > len(self.histogram):
                self.histogram = np.pad(self.histogram, (0, len(counts) - len(self.histogram)))
            self.histogram[: len(counts)] += counts

    def close(self) -> dict[str, Any]:
        self.bin.close()
        self.idx.close()
        return {
            "tokens": self.end,
            "longest": len(self.histogram) - 1,
            "length_histogram": self.histogram.tolist(),
        }


def _source_files(files: list[PairFiles]) -> list[dict[str, Any]]:
    return [
        {
            side: {
                "path": str(getattr(p, side)),
                "bytes": getattr(p, side).stat().st_size,
                "sha256": sha256_file(getattr(p, side)),
            }
            for side in shards.SIDES
        }
        for p in files
    ]


def _collect_bad(stats: list[dict[str, Any]]) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    first: list[dict[str, Any]] = []
    for s in stats:
        for b in s["bad"]:
            counts["over max_len" if "max_len" in b["reason"] else b["reason"]] += 1
            if len(first) < MAX_REPORTED:
                first.append(b)
    return {"counts": dict(counts), "first": first}


@dataclass(frozen=True)
class Result:
    """What a preprocessing run wrote: the shards folder and its header."""

    out: Path
    header: dict[str, Any]
    parts_run: int  # part files encoded by this run (the rest came from a stopped one)
    seconds: float


def _header(kind: str, tokenizer: Tokenizer, **fields: Any) -> dict[str, Any]:
    return {
        "format": shards.FORMAT,
        "version": shards.VERSION,
        "kind": kind,
        "dtype": str(shards.token_dtype(tokenizer.vocab_size)),
        "vocab_size": tokenizer.vocab_size,
        "tokenizer_kind": tokenizer.kind,
        "tokenizer_sha256": tokenizer_digest(tokenizer),
        **fields,
    }


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists: pass --overwrite to replace it")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a folder")


def _train_lines(files: list[PairFiles]) -> Iterator[str]:
    """Both sides of every pair that passes the text checks, streamed: what the BPE model
    is trained on (the same lines ``aiayn train`` trains it on from plain files)."""
    for pair in files:
        for s_raw, t_raw in paired_lines(pair.source, pair.target):
            s, t = decode(s_raw), decode(t_raw)
            if s is not None and t is not None and s.strip() and t.strip():
                yield s
                yield t


def preprocess_parallel(
    train: list[PairFiles],
    valid: list[PairFiles],
    out: str | os.PathLike[str],
    *,
    vocab_size: int,
    max_len: int | None,
    tokenizer: Tokenizer | None = None,
    workers: int | None = None,
    chunk: int = CHUNK_PAIRS,
    overwrite: bool = False,
    log: Log = print,
) -> Result:
    """Shards of a parallel corpus (module docstring): a shared BPE vocabulary of
    ``vocab_size`` trained on both sides of ``train`` (or ``tokenizer`` as given), pairs over
    ``max_len`` tokens (with BOS/EOS) left out and reported."""
    t0 = time.perf_counter()
    out = Path(out)
    _check_out(out, overwrite)
    if not train or not valid:
        raise UserError("preprocessing a parallel corpus needs training and validation files")
    workers = workers or os.cpu_count() or 1
    spec = {
        "kind": "parallel",
        "vocab_size": vocab_size,
        "max_len": max_len,
        "chunk": chunk,
        "tokenizer": None if tokenizer is None else tokenizer_digest(tokenizer),
        "train": [[_file_identity(p.source), _file_identity(p.target)] for p in train],
        "valid": [[_file_identity(p.source), _file_identity(p.target)] for p in valid],
    }
    work = WorkDir(out, spec, log)

    def train_tokenizer() -> Tokenizer:
        if tokenizer is not None:
            return tokenizer
        log(f"training a {vocab_size:,}-token BPE vocabulary on {len(train)} file pair(s)")
        return BPETokenizer.from_lines(_train_lines(train), vocab_size)

    tok = work.tokenizer(train_tokenizer)
    init = (work.tokenizer_file.read_text(), str(work.parts), max_len)
    run = 0
    for split, files in (("train", train), ("valid", valid)):
        log(f"encoding the {split} split on {workers} process(es)")
        run += run_chunks(
            pair_chunks(split, files, chunk), encode_pair_chunk, work.has, workers, init
        )
    header = _assemble_parallel(out, work, tok, {"train": train, "valid": valid}, max_len)
    shutil.rmtree(work.path, ignore_errors=True)
    return Result(out, header, run, time.perf_counter() - t0)


def _assemble_parallel(
    out: Path, work: WorkDir, tok: Tokenizer, files: dict[str, list[PairFiles]], max_len: int | None
) -> dict[str, Any]:
    """Concatenate the parts, in order, into the shards folder, and commit it atomically."""
    dtype = shards.token_dtype(tok.vocab_size)
    tmp = begin_folder(out)
    try:
        splits: dict[str, Any] = {}
        all_stats = []
        for split in files:
            sides = {side: _Appender(tmp, split, side, dtype) for side in shards.SIDES}
            blank = 0
            for part in sorted(work.parts.glob(f"{split}-*.npz")):
                arrays, stats = work.load(part.name)
                for side in shards.SIDES:
                    sides[side].add(arrays[side], arrays[f"{side}_len"])
                blank += stats["blank"]
                all_stats.append(stats)
            summary = {side: a.close() for side, a in sides.items()}
            pairs = sides["source"].count
            if pairs == 0:
                raise UserError(f"no {split} pairs are left after the checks")
            splits[split] = {"pairs": pairs, "blank_pairs": blank, **summary}
        header = _header(
            "parallel",
            tok,
            max_len=max_len,
            splits=splits,
            sources={s: _source_files(f) for s, f in files.items()},
            bad_lines=_collect_bad(all_stats),
        )
        tok.save(tmp / shards.TOKENIZER_FILE)
        (tmp / shards.HEADER_FILE).write_text(json.dumps(header, indent=1))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    commit_folder(tmp, out)
    return header


def _text_tokenizer(path: Path, kind: str, vocab_size: int) -> Tokenizer:
    """A language model's tokenizer from its text, streamed: characters (the set of those in
    the text) or byte-level BPE (trained on its lines, as ``aiayn train`` splits the whole
    text with ``str.splitlines``).  Lines that are not UTF-8 are left out, as encoding does."""
    texts = (t for t in (decode(line) for line in line_bytes(path, keep_ends=True)) if t)
    if kind == "char":
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        if not chars:
            raise UserError(f"text file {path} is empty")
        return CharTokenizer(sorted(chars))
    return BPETokenizer.from_lines((ln for t in texts for ln in t.splitlines(True)), vocab_size)


def preprocess_text(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    tokenizer_kind: str,
    vocab_size: int,
    tokenizer: Tokenizer | None = None,
    workers: int | None = None,
    chunk_bytes: int = CHUNK_TEXT_BYTES,
    overwrite: bool = False,
    log: Log = print,
) -> Result:
    """Shards of a language model's text: one stream of ids, as ``aiayn train`` encodes the
    whole file (module docstring)."""
    t0 = time.perf_counter()
    out, path = Path(out), Path(path)
    _check_out(out, overwrite)
    workers = workers or os.cpu_count() or 1
    spec = {
        "kind": "text",
        "tokenizer_kind": tokenizer_kind,
        "vocab_size": vocab_size,
        "chunk": chunk_bytes,
        "text": _file_identity(path),
        "tokenizer": None if tokenizer is None else tokenizer_digest(tokenizer),
    }
    work = WorkDir(out, spec, log)
    tok = work.tokenizer(lambda: tokenizer or _text_tokenizer(path, tokenizer_kind, vocab_size))
    init = (work.tokenizer_file.read_text(), str(work.parts), None)
    log(f"encoding {path} on {workers} process(es)")
    run = run_chunks(text_chunks(path, chunk_bytes), encode_text_chunk, work.has, workers, init)
    dtype = shards.token_dtype(tok.vocab_size)
    tmp = begin_folder(out)
    try:
        stats, tokens = [], 0
        with open(tmp / shards.TEXT_FILE, "wb") as fh:
            for part in sorted(work.parts.glob("text-*.npz")):
                arrays, s = work.load(part.name)
                arrays["text"].astype(dtype).tofile(fh)
                tokens += len(arrays["text"])
                stats.append(s)
        if tokens == 0:
            raise UserError(f"text file {path} is empty")
        header = _header(
            "text",
            tok,
            tokens=tokens,
            sources={
                "text": {
                    "path": str(path),
                    "bytes": path.stat().st_size,
                    "sha256": sha256_file(path),
                }
            },
            bad_lines=_collect_bad(stats),
        )
        tok.save(tmp / shards.TOKENIZER_FILE)
        (tmp / shards.HEADER_FILE).write_text(json.dumps(header, indent=1))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    commit_folder(tmp, out)
    shutil.rmtree(work.path, ignore_errors=True)
    return Result(out, header, run, time.perf_counter() - t0)
