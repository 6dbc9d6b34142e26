"""A Hugging Face folder's ``generation_config.json``: which ids start, pad and end a text.

transformers' ``generate`` reads a model's special ids from ``generation_config.json``, or from
``config.json`` where a folder has none.  A chat model often ends a turn with more
than one token (Llama 3's ``<|eot_id|>`` and ``<|end_of_text|>``; Qwen's ``<|im_end|>`` and
``<|endoftext|>``), so ``eos_token_id`` may be a list: generation stops at any of them.

``read_generation`` reads the folder; the result travels in a checkpoint's run record
(``run["generation"]``), so an aiayn checkpoint converted from the folder keeps it, and
``generation_of`` reads it back from any bundle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiayn.errors import CheckpointError
from aiayn.interop.json_files import read_json_object


@dataclass(frozen=True)
class GenerationIds:
    """The ids that start (``bos``), pad and end (any of ``eos``) a generated text, and the
    first id an encoder-decoder's decoder reads (``decoder_start``; Marian's is its pad)."""

    bos: int | None = None
    pad: int | None = None
    eos: tuple[int, ...] = ()
    decoder_start: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "eos": list(self.eos)}


NONE = GenerationIds()


def _ids(value: Any, where: str) -> tuple[int, ...]:
    """One id, a list of ids, or null, as an id tuple."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise CheckpointError(f"{where} should be a token id or a list of ids, not {value!r}")
    return tuple(values)


def _one(value: Any, where: str) -> int | None:
    ids = _ids(value, where)
    if len(ids) > 1:
        raise CheckpointError(f"{where} should be one token id, not {value!r}")
    return ids[0] if ids else None


def read_generation(directory: str | os.PathLike[str]) -> GenerationIds:
    """The folder's ids, as transformers reads them: from ``generation_config.json`` where the
    folder has one (an id it leaves out is None, even if ``config.json`` names one), else from
    ``config.json``."""
    folder = Path(directory)
    path = folder / "generation_config.json"
    if not path.is_file():
        path = folder / "config.json"
    if not path.is_file():
        return NONE
    data = read_json_object(path)
    return GenerationIds(
        bos=_one(data.get("bos_token_id"), f"{path}: bos_token_id"),
        pad=_one(data.get("pad_token_id"), f"{path}: pad_token_id"),
        eos=_ids(data.get("eos_token_id"), f"{path}: eos_token_id"),
        decoder_start=_one(data.get("decoder_start_token_id"), f"{path}: decoder_start_token_id"),
    )


def generation_of(run: Mapping[str, Any]) -> GenerationIds:
    """The ids a checkpoint's run record carries (``NONE`` for a model aiayn trained,
    which has no end-of-text token unless its tokenizer defines one)."""
    stored = run.get("generation")
    if not stored:
        return NONE
    return GenerationIds(
        bos=_one(stored.get("bos"), "run.json: generation.bos"),
        pad=_one(stored.get("pad"), "run.json: generation.pad"),
        eos=_ids(stored.get("eos"), "run.json: generation.eos"),
        decoder_start=_one(stored.get("decoder_start"), "run.json: generation.decoder_start"),
    )
