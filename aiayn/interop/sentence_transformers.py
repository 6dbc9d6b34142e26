"""A sentence-transformers folder's own recipe for turning token vectors into one embedding.

A published embedding model is more than its BERT weights: ``modules.json`` lists the steps
after the transformer (pooling, then often ``Normalize``), ``1_Pooling/config.json`` says which
pooling (the mean over real tokens, the [CLS] vector, the maximum, ...), and
``sentence_bert_config.json`` how many tokens the model reads (``max_seq_length``, often less
than BERT's 512) and whether it lower-cases.  ``read_pooling`` reads them, so that
``aiayn embed`` gives what ``SentenceTransformer(folder).encode`` gives.

Folders without ``modules.json`` (a plain BERT) get ``DEFAULT_POOLING``: the mean over
real tokens, scaled to unit length -- the usual recipe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.atomic import inside
from aiayn.errors import CheckpointError
from aiayn.interop.json_files import read_json, read_json_object

# The modes sentence-transformers knows, in the order it concatenates them when a folder
# asks for several (its legacy boolean keys map onto these names).
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_POOLING_TYPE = "sentence_transformers.models.Pooling"
_NORMALIZE_TYPE = "sentence_transformers.models.Normalize"


@dataclass(frozen=True)
class Pooling:
    """How token vectors become a sentence vector.

    ``modes`` -- one or more of ``POOLING_MODES``, concatenated in that order;
    ``normalize`` -- scale the result to unit length; ``max_tokens`` -- read at most this many
    tokens ([CLS] and [SEP] included), None for the model's own limit; ``lowercase`` --
    lower-case the text before tokenizing (sentence-transformers' ``do_lower_case``).
    """

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = True
    max_tokens: int | None = None
    lowercase: bool = False

    def __post_init__(self) -> None:
        if not self.modes:
            raise CheckpointError(
                "Pooling.modes is empty: name at least one of " + ", ".join(POOLING_MODES)
            )
        for mode in self.modes:
            if mode not in POOLING_MODES:
                raise CheckpointError(
                    f"pooling mode {mode!r} is not one of {', '.join(POOLING_MODES)}"
                )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise CheckpointError(f"Pooling.max_tokens={self.max_tokens} must be >= 1")


DEFAULT_POOLING = Pooling()


def _modes(config: dict[str, Any], path: Path) -> tuple[str, ...]:
    """The pooling modes of a ``1_Pooling/config.json``, new (``pooling_mode``) or legacy."""
    if "pooling_mode" in config:
        named = config["pooling_mode"]
        modes = (named,) if isinstance(named, str) else tuple(named)
    else:
        modes = tuple(mode for key, mode in _LEGACY_KEYS.items() if config.get(key, False))
    if not modes:
        raise CheckpointError(f"{path} selects no pooling mode (expected one of {POOLING_MODES})")
    return modes  # concatenated in this order


def read_pooling(directory: str | os.PathLike[str]) -> Pooling:
    """The folder's pooling recipe (module docstring); ``DEFAULT_POOLING`` without one."""
    folder = Path(directory)
    modules_path = folder / "modules.json"
    if not modules_path.is_file():
        return DEFAULT_POOLING
    modules = read_json(modules_path)
    if not isinstance(modules, list):
        raise CheckpointError(
            f"{modules_path} should hold a list of modules, not {type(modules).__name__}"
        )
    types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
    pooling = next(
        (m for m in modules if isinstance(m, dict) and m.get("type") == _POOLING_TYPE), None
    )
    if pooling is None:
        raise CheckpointError(f"{modules_path} has no {_POOLING_TYPE} module: aiayn cannot pool it")
    module = pooling.get("path", "")  # a subfolder of the model's folder
    name = f"{module}/config.json" if module else "config.json"
    config_path = inside(folder, name, f"{modules_path} ({_POOLING_TYPE} path)")
    config = read_json_object(config_path)
    modes = _modes(config, config_path)
    settings: dict[str, Any] = {}
    bert_config = folder / "sentence_bert_config.json"
    if bert_config.is_file():
        settings = read_json_object(bert_config)
    return Pooling(
        modes,
        normalize=_NORMALIZE_TYPE in types,
        max_tokens=settings.get("max_seq_length"),
        lowercase=bool(settings.get("do_lower_case", False)),
    )
