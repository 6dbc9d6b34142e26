"""The small JSON files of a Hugging Face folder, read with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    """The file's JSON; a missing, unreadable, non-UTF-8 or malformed file is a ValueError."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"cannot read {path}: {err}") from err


def read_json_object(path: Path) -> dict[str, Any]:
    """:func:`read_json` of a file that must hold one JSON object."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object, not {type(data).__name__}")
    return data
