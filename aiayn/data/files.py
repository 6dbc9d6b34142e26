"""Finding the data folder and reading line-oriented text (plain or gzip) with clear errors.

The data folder comes from, in order: an explicit argument (the CLI's ``--data``), the
environment variable ``AIAYN_DATA``, or ``../shared/data`` beside the current folder.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from aiayn.errors import UserError

ENV_VAR = "AIAYN_DATA"


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The folder holding ``multi30k/`` and ``tinyshakespeare/``."""
    if explicit is not None:
        path = Path(explicit)
    elif os.environ.get(ENV_VAR):
        path = Path(os.environ[ENV_VAR])
    else:
        path = Path.cwd().parent / "shared" / "data"
    if not path.is_dir():
        raise UserError(f"data folder {path} does not exist: pass --data DIR or set {ENV_VAR}=DIR")
    return path


def read_text(path: str | os.PathLike[str]) -> str:
    """A whole UTF-8 text file (``.gz`` is decompressed).

    Raises ValueError naming the file for a missing, empty, or non-UTF-8 file (with the line
    number of the first bad byte sequence).
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"text file {p} does not exist")
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as err:
        raise UserError(f"cannot read {p}: {err}") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise UserError(f"{p}, line {line}: not valid UTF-8 text ({err.reason})") from None
    if not text.strip():
        raise UserError(f"text file {p} is empty")
    return text


def split_lines(text: str) -> list[str]:
    """Lines of ``text`` split at ``\n`` (and ``\r\n``) only, without their endings.

    ``str.splitlines`` also splits at U+2028, U+0085, form feeds and other separators that
    can stand inside a sentence; in parallel files that would pair a sentence's second half
    with the next sentence's translation, and give a translation file more lines than its
    input."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start another
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path: str | os.PathLike[str]) -> list[str]:
    """All lines of a text file (see ``read_text``), without line endings."""
    return split_lines(read_text(path))
