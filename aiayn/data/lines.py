"""Streaming the lines of plain, gzip or xz text files, without reading a file whole.

A corpus of millions of lines is read one line at a time as bytes: decoding is left to the
caller, so that a line that is not UTF-8 can be reported by file and line number and left out
rather than stop the whole read (aiayn/data/preprocess.py).  Lines end at ``\\n`` only (with a
``\\r`` before it dropped), as ``aiayn.data.files.split_lines`` splits them.
"""

from __future__ import annotations

import gzip
import lzma
import os
from collections.abc import Iterator
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO, cast

from aiayn.errors import UserError


def open_binary(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading bytes, decompressed when it ends in ``.gz`` or ``.xz``."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"text file {p} does not exist")
    if p.suffix == ".gz":
        return cast(BinaryIO, gzip.open(p, "rb"))
    if p.suffix == ".xz":
        return cast(BinaryIO, lzma.open(p, "rb"))
    return open(p, "rb")


def line_bytes(path: str | os.PathLike[str], *, keep_ends: bool = False) -> Iterator[bytes]:
    """The lines of ``path`` as bytes, without their ``\\n`` (or ``\\r\\n``) unless
    ``keep_ends``.  Raises ValueError naming the file when it cannot be read (a truncated
    gzip stream, say)."""
    try:
        with open_binary(path) as fh:
            for raw in fh:
                if keep_ends:
                    yield raw
                elif raw.endswith(b"\n"):
                    yield raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
                else:
                    yield raw[:-1] if raw.endswith(b"\r") else raw
    except (OSError, EOFError, lzma.LZMAError) as err:
        raise UserError(f"cannot read {path}: {err}") from err


def paired_lines(
    source: str | os.PathLike[str], target: str | os.PathLike[str]
) -> Iterator[tuple[bytes, bytes]]:
    """The lines of two line-aligned files, side by side.  Raises ValueError naming both files
    and their line counts when one ends before the other."""
    for n, (s, t) in enumerate(zip_longest(line_bytes(source), line_bytes(target))):
        if s is None or t is None:
            longer, shorter = (target, source) if s is None else (source, target)
            raise UserError(
                f"parallel files differ in length: {shorter} has {n} lines, {longer} has more"
            )
        yield s, t


def decode(line: bytes) -> str | None:
    """The line as text, or None when it is not UTF-8."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError:
        return None
