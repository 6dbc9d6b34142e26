"""The small JSON files of a Hugging Face folder, read with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiayn.errors import CheckpointError


def read_json(path: Path) -> Any:
    """The file's JSON; a missing, unreadable, non-UTF-8 or malformed file is a ValueError."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from err


def read_json_object(path: Path) -> dict[str, Any]:
    """``read_json`` of a file that must hold one JSON object."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} should hold a JSON object, not {type(data).__name__}")
    return data
