"""Token shards: a corpus tokenized once (``aiayn preprocess``), then read through mmap.

A shards folder, written atomically by aiayn/data/preprocess.py (nanoGPT's ``train.bin``,
fairseq's and Megatron's indexed datasets are the same idea):

* ``header.json`` -- the format, the kind (``"parallel"`` or ``"text"``), the token dtype, the
  tokenizer's SHA-256 and vocabulary size, per split the counts, the longest sentence and a
  histogram of lengths, the source files' SHA-256, and the lines left out, with their reason;
* ``tokenizer.json`` -- the tokenizer that made the ids (aiayn's format);
* parallel text: ``{split}.{side}.bin``, the ids of every sentence one after the other
  (uint16, or uint32 for vocabularies over 65,536; no BOS/EOS), and ``{split}.{side}.idx``,
  N + 1 int64 offsets: sentence i is ``bin[idx[i] : idx[i + 1]]``; splits ``train`` and
  ``valid``, sides ``source`` and ``target``;
* a language model's text: ``text.bin``, the whole stream of ids;
* ``manifest.json`` -- every file's size and SHA-256 (aiayn/atomic.py).

Reading maps the files and copies only what a batch needs; the length of every sentence comes
from the offsets alone, so that batches are planned without reading a token
(aiayn/data/batching.py).  Pages the reads touched are handed back to the kernel every
``RELEASE_READS`` reads (``Mapped.release``): without that, the pages the kernel maps
around each scattered read pile up in the process's resident memory, about 20 MB a training
step on a corpus of 4.5M pairs, and the resident set grows with the corpus.  The same classes hold small corpora in memory (``Sequences.from_lists``): the
plain-files path of training reads through them too.

Shapes: N sentences, B sentences in a batch, S / T source / target lengths.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch
from torch import Tensor

from aiayn.atomic import MANIFEST_FILE, inside
from aiayn.errors import UserError

FORMAT = "aiayn-shards"
VERSION = 1
HEADER_FILE = "header.json"
TOKENIZER_FILE = "tokenizer.json"
TEXT_FILE = "text.bin"
SIDES = ("source", "target")
SPLITS = ("train", "valid")
# A read from a mapped file maps more than it reads: the kernel faults in the pages around it
# (about 160 KB a random read, measured).  Every this many reads, the map's pages go back.
RELEASE_READS = 128


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """uint16 where every id fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def bin_name(split: str, side: str) -> str:
    return f"{split}.{side}.bin"


def idx_name(split: str, side: str) -> str:
    return f"{split}.{side}.idx"


class Mapped:
    """A read-only file mapped into memory, as a numpy array of ``dtype``; empty files give an
    empty array (mmap cannot map zero bytes)."""

    def __init__(self, path: Path, dtype: np.dtype[Any]) -> None:
        self.path, self.dtype = path, dtype
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise UserError(
                f"{path}: size = {size} bytes; expected a whole number of {dtype} values"
                f" ({dtype.itemsize} bytes each)"
            )
        self._map: mmap.mmap | None = None
        if size == 0:
            self.array: np.ndarray = np.zeros(0, dtype)
            return
        with open(path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self.array = np.frombuffer(self._map, dtype=dtype)
        self._read = 0

    def note_read(self, reads: int) -> None:
        """Count scattered reads (rows, windows); past ``RELEASE_READS``, release the
        touched pages (one madvise call over the whole map)."""
        self._read += reads
        if self._read >= RELEASE_READS:
            self.release()

    def release(self) -> None:
        """Drop this mapping's pages from the process's resident set (they stay in the page
        cache, so a later read costs no disk access).  The array stays valid."""
        self._read = 0
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)


class Sequences:
    """N token sequences: a flat array of ids and N + 1 offsets, mapped or in memory."""

    def __init__(
        self, tokens: np.ndarray, offsets: np.ndarray, maps: Sequence[Mapped] = ()
    ) -> None:
        if len(offsets) == 0 or int(offsets[0]) != 0 or int(offsets[-1]) != len(tokens):
            raise UserError(
                f"offsets index does not span the tokens: it ends at"
                f" {int(offsets[-1]) if len(offsets) else 'nothing'}, the tokens number"
                f" {len(tokens)}"
            )
        self.tokens, self.offsets, self.maps = tokens, offsets, tuple(maps)

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], dtype: np.dtype[Any]) -> Sequences:
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=offsets[1:])
        flat = [i for r in rows for i in r]
        return cls(np.asarray(flat, dtype=dtype), offsets)

    @classmethod
    def open(
        cls, folder: Path, split: str, side: str, dtype: np.dtype[Any], vocab_size: int
    ) -> Sequences:
        """The mapped split, its offsets and ids checked (``check_offsets``,
        ``check_ids``) before anything reads them."""
        tokens = Mapped(shard_file(folder, bin_name(split, side)), dtype)
        offsets = Mapped(shard_file(folder, idx_name(split, side)), np.dtype(np.int64))
        check_offsets(offsets, len(tokens.array))
        check_ids(tokens, vocab_size)
        return cls(tokens.array, offsets.array, (tokens, offsets))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def where(self) -> str:
        """The offsets file these sequences were mapped from, or ``"in memory"``."""
        return str(self.maps[-1].path) if self.maps else "in memory"

    def lengths(self, chunk: int = 1 << 20) -> np.ndarray:
        """(N,) sentence lengths from the offsets alone, uint16 where they fit (else int32):
        read in chunks, then released, so that 4.5M sentences cost 9 MB."""
        longest = 0
        for start in range(0, len(self), chunk):
            longest = max(
                longest, int(np.diff(self.offsets[start : start + chunk + 1]).max(initial=0))
            )
        out = np.empty(len(self), dtype=np.uint16 if longest < (1 << 16) - 1 else np.int32)
        for start in range(0, len(self), chunk):
            part = self.offsets[start : start + chunk + 1]
            out[start : start + len(part) - 1] = np.diff(part)
        self.release()
        return out

    def rows(self, indices: np.ndarray) -> list[np.ndarray]:
        """The sequences at ``indices``, copied out of the map."""
        starts, ends = self.offsets[indices], self.offsets[indices + 1]
        got = [
            np.array(self.tokens[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)
        ]
        for m in self.maps:
            m.note_read(len(indices))
        return got

    def release(self) -> None:
        for m in self.maps:
            m.release()


def padded(
    rows: Sequence[np.ndarray], pad_id: int, *, prefix: int | None = None, suffix: int | None = None
) -> Tensor:
    """(B, longest) long tensor of ``[prefix] + row + [suffix]``, right-padded."""
    extra = (prefix is not None) + (suffix is not None)
    width = max(len(r) for r in rows) + extra
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    start = 1 if prefix is not None else 0
    for i, r in enumerate(rows):
        if prefix is not None:
            out[i, 0] = prefix
        out[i, start : start + len(r)] = r
        if suffix is not None:
            out[i, start + len(r)] = suffix
    return torch.from_numpy(out)


@dataclass
class ParallelSplit:
    """Sentence pairs of one split: source and target ``Sequences``."""

    source: Sequences
    target: Sequences

    def __post_init__(self) -> None:
        if len(self.source) != len(self.target):
            raise UserError(
                f"{self.target.where}: sentences = {len(self.target)}; expected as many as the"
                f" source side's {len(self.source)} ({self.source.where})"
            )

    def __len__(self) -> int:
        return len(self.source)

    def release(self) -> None:
        self.source.release()
        self.target.release()


def read_header(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of a shards folder, checked: the format, the version, the kind, the token
    dtype, the vocabulary size, the tokenizer's SHA-256 and the splits (each side's longest
    sentence, which training reads), and every file the manifest lists inside the
    folder and present at its size (the full SHA-256 check is ``verify``).  A folder from
    elsewhere that is wrong in any of them is a ValueError naming the file and the field."""
    folder = Path(folder)
    path = folder / HEADER_FILE
    if not path.is_file():
        raise UserError(
            f"{folder} holds no token shards ({HEADER_FILE} is missing): make them with"
            " aiayn preprocess"
        )
    try:
        header = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"corrupt shards header {path}: {err}") from err
    if not isinstance(header, dict):
        raise UserError(f"corrupt shards header {path}: expected a JSON object")
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise UserError(
            f"{path} is not aiayn shards of version {VERSION} (format"
            f" {header.get('format')!r}, version {header.get('version')!r}): make them again"
            " with aiayn preprocess"
        )
    _check_header(header, path)
    _check_manifest_sizes(folder)
    return header


class _Missing:
    """A header field that is not there."""

    def __repr__(self) -> str:
        return "missing"


MISSING = _Missing()


def _count(value: object) -> TypeGuard[int]:
    """A non-negative int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _sha256(value: object) -> bool:
    """64 lower-case hex digits."""
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


# The header's fields that reading and training rely on: (field, what it must be, the test).
FIELDS: tuple[tuple[str, str, Callable[[object], bool]], ...] = (
    ("kind", "'parallel' or 'text'", lambda v: v in ("parallel", "text")),
    ("dtype", "'uint16' or 'uint32'", lambda v: v in ("uint16", "uint32")),
    ("vocab_size", "a positive integer", lambda v: _count(v) and v > 0),
    ("tokenizer_sha256", "a SHA-256 of 64 hex digits", _sha256),
)
SPLITS_WANTED = f"an object whose keys are some of {list(SPLITS)}"


def _check_header(header: dict[str, Any], path: Path) -> None:
    """The fields reading and training rely on, each present, of the kind and in the range it
    must be; a ValueError names the first that is not."""
    problem = next(_header_problems(header), None)
    if problem is not None:
        field, value, want = problem
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise UserError(f"{path}: {field} = {shown}; expected {want}")
    if np.dtype(header["dtype"]) != token_dtype(header["vocab_size"]):
        raise UserError(
            f"{path}: dtype = {header['dtype']!r} does not hold a vocabulary of"
            f" {header['vocab_size']} (expected {token_dtype(header['vocab_size'])})"
        )


def _header_problems(header: dict[str, Any]) -> Iterator[tuple[str, object, str]]:
    """(field, its value, what was expected) for every wrong field, in order."""
    for field, want, fine in FIELDS:
        value = header.get(field, MISSING)
        if value is MISSING or not fine(value):
            yield field, value, want
    if header.get("kind") != "parallel":
        return
    splits = header.get("splits", MISSING)
    if not isinstance(splits, dict) or not splits or not all(n in SPLITS for n in splits):
        yield "splits", splits, SPLITS_WANTED
        return
    for split, info in splits.items():
        for side in SIDES:
            longest = _field(info, side, "longest")
            if not _count(longest):
                yield f"splits.{split}.{side}.longest", longest, "a non-negative integer"


def _field(value: object, *keys: str) -> object:
    """``value[k1][k2]...``, or ``MISSING`` where one is not an object with that key."""
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return MISSING
        value = value[key]
    return value


def _check_manifest_sizes(folder: Path) -> None:
    manifest = folder / MANIFEST_FILE
    if not manifest.is_file():
        return
    try:
        files = json.loads(manifest.read_text())["files"]
        entries = [(name, int(meta["size"])) for name, meta in files.items()]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"corrupt manifest {manifest}: {err}") from err
    for name, size in entries:
        f = inside(folder, name, str(manifest))
        if not f.is_file() or f.stat().st_size != size:
            raise UserError(f"shard file {f} is missing or truncated (expected {size} bytes)")


def shard_file(folder: Path, name: str) -> Path:
    """``folder / name``, a regular file inside ``folder`` (no symbolic link out of it, no
    device or pipe); else a ValueError naming it."""
    path = inside(folder, name, str(folder / HEADER_FILE))
    if not path.is_file():
        raise UserError(
            f"{path}: missing (or not a regular file); expected the shard file the header's"
            " kind and splits call for"
        )
    return path


def check_ids(mapped: Mapped, vocab_size: int, chunk: int = 1 << 24) -> None:
    """Every id of ``mapped`` below ``vocab_size``: read in chunks, its pages then released
    (an id past the embedding table would fail deep inside training, or index out of it)."""
    ids = mapped.array
    for start in range(0, len(ids), chunk):
        part = ids[start : start + chunk]
        if int(part.max()) >= vocab_size:
            at = start + int(np.argmax(part >= vocab_size))
            raise UserError(
                f"{mapped.path}: token {at} has id {int(ids[at])}; expected ids below the"
                f" header's vocab_size={vocab_size}"
            )
    mapped.release()


def check_offsets(mapped: Mapped, tokens: int, chunk: int = 1 << 24) -> None:
    """N + 1 offsets that start at 0, never decrease and end at the token count."""
    offsets = mapped.array
    if len(offsets) == 0 or int(offsets[0]) != 0 or int(offsets[-1]) != tokens:
        first = int(offsets[0]) if len(offsets) else None
        last = int(offsets[-1]) if len(offsets) else None
        raise UserError(
            f"{mapped.path}: offsets run from {first} to {last}; expected 0 to the token"
            f" count, {tokens}"
        )
    for start in range(0, len(offsets) - 1, chunk):
        part = offsets[start : start + chunk + 1]
        falls = np.flatnonzero(np.diff(part) < 0)
        if len(falls):
            i = start + int(falls[0])
            raise UserError(
                f"{mapped.path}: offset {i + 1} ({int(offsets[i + 1])}) is below offset {i}"
                f" ({int(offsets[i])}); expected offsets that never decrease"
            )
    mapped.release()


def verify(folder: str | os.PathLike[str]) -> None:
    """Every file of a shards folder against its SHA-256 in the manifest."""
    from aiayn.atomic import verify_manifest

    verify_manifest(Path(folder))


def open_parallel(
    folder: str | os.PathLike[str],
) -> tuple[dict[str, Any], dict[str, ParallelSplit]]:
    """The header and the mapped splits of a parallel-text shards folder."""
    folder = Path(folder)
    header = read_header(folder)
    if header["kind"] != "parallel":
        raise UserError(f"{folder} holds {header['kind']!r} shards, not parallel text")
    dtype, vocab = np.dtype(header["dtype"]), header["vocab_size"]
    splits = {
        split: ParallelSplit(*(Sequences.open(folder, split, side, dtype, vocab) for side in SIDES))
        for split in header["splits"]
    }
    return header, splits


def open_text(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], Mapped]:
    """The header and the mapped token stream of a language model's shards folder."""
    folder = Path(folder)
    header = read_header(folder)
    if header["kind"] != "text":
        raise UserError(f"{folder} holds {header['kind']!r} shards, not a text stream")
    stream = Mapped(shard_file(folder, TEXT_FILE), np.dtype(header["dtype"]))
    check_ids(stream, header["vocab_size"])
    return header, stream
