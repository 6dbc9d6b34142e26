"""Saving and loading models: weights in safetensors, config in JSON, written atomically.

A saved model is a folder::

    config.json        the ModelConfig (self-describing: enough to rebuild the model)
    model.safetensors  the weights (tied tensors stored once; never pickled), or dcp/ in a
                       sharded training checkpoint (aiayn/checkpoint/sharded.py)
    manifest.json      every file's size and SHA-256, checked when the folder is loaded

The folder is written by :func:`aiayn.atomic.write_atomically`: a crash leaves the
old folder or the new one, never half of one, and a damaged file is named when loading.

:func:`save` and :func:`load_model` are the pair for a model alone (``aiayn.save``,
``aiayn.load_model``); a checkpoint -- the model with its tokenizer -- is read with
:func:`aiayn.checkpoint.load` (aiayn/checkpoint/loader.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_model as read_weights
from safetensors.torch import save_model

from aiayn.atomic import recover, verify_manifest, write_atomically
from aiayn.checkpoint.sharded import is_sharded_checkpoint, load_model_weights
from aiayn.config import ModelConfig
from aiayn.models import TransformerModel, build_model

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def write_config(model: TransformerModel, folder: Path) -> None:
    (folder / CONFIG_FILE).write_text(model.config.to_json())


def write_model(model: TransformerModel, folder: Path) -> None:
    """Write config.json and model.safetensors into an existing (temporary) folder."""
    write_config(model, folder)
    save_model(model, str(folder / WEIGHTS_FILE), metadata={"format": "pt", "library": "aiayn"})


def save(model: TransformerModel, directory: str | os.PathLike[str]) -> Path:
    """Write ``model`` to ``directory`` (config.json + model.safetensors), atomically."""
    return write_atomically(Path(directory), lambda tmp: write_model(model, tmp))


def checked_folder(directory: str | os.PathLike[str], what: str = "saved model") -> Path:
    """``directory`` as a Path, after the manifest check; a folder a crash left renamed aside
    is put back, and nothing is deleted (a writer may be filling its temporary neighbours)."""
    path = Path(directory)
    recover(path, remove=False)
    if not path.is_dir():
        raise ValueError(f"no {what} at {path}: not a folder")
    verify_manifest(path)
    return path


def read_config(directory: str | os.PathLike[str]) -> ModelConfig:
    """The ModelConfig stored in a model folder (nothing else is read)."""
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"no saved model at {path}: not a folder")
    cfg = path / CONFIG_FILE
    if not cfg.is_file():
        raise ValueError(f"no saved model at {path}: {CONFIG_FILE} is missing")
    try:
        return ModelConfig.from_json(cfg.read_text())
    except (ValueError, TypeError, UnicodeDecodeError) as err:
        raise ValueError(f"corrupt model config {cfg}: {err}") from err


def load_model(directory: str | os.PathLike[str], *, device: str = "cpu") -> TransformerModel:
    """Rebuild the model saved in ``directory`` and load its weights (strictly), from
    model.safetensors or, in a sharded checkpoint, from its ``dcp/`` shards."""
    path = checked_folder(directory)
    config = read_config(path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file() and is_sharded_checkpoint(path):
        model = build_model(config)
        load_model_weights(path, model)
        return model.to(device)
    if not weights.is_file():
        raise ValueError(f"no saved model at {path}: {WEIGHTS_FILE} is missing")
    model = build_model(config)
    try:
        missing, unexpected = read_weights(model, str(weights), strict=False, device=device)
    except (SafetensorError, OSError, RuntimeError, json.JSONDecodeError) as err:
        raise ValueError(f"corrupt weights file {weights}: {err}") from err
    if missing or unexpected:
        raise ValueError(
            f"weights in {weights} do not match the config: missing {sorted(missing)[:5]},"
            f" unexpected {sorted(unexpected)[:5]}"
        )
    return model.to(device)
