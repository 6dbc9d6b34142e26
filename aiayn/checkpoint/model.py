"""Saving and loading models: weights in safetensors, config in JSON, written atomically.

A saved model is a folder::

    config.json        the ModelConfig (self-describing: enough to rebuild the model)
    model.safetensors  the weights (tied tensors stored once; never pickled), or dcp/ in a
                       sharded training checkpoint (aiayn/checkpoint/sharded.py)
    manifest.json      every file's size and SHA-256, checked when the folder is loaded

The folder is written by ``aiayn.atomic.write_atomically``: a crash leaves the
old folder or the new one, never half of one, and a damaged file is named when loading.

``save`` and ``load_model`` are the pair for a model alone (``aiayn.save``,
``aiayn.load_model``); a checkpoint -- the model with its tokenizer -- is read with
``aiayn.checkpoint.load`` (aiayn/checkpoint/loader.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_model as read_weights
from safetensors.torch import save_model

from aiayn.atomic import OLD_MARK, recover, verify_manifest, write_atomically
from aiayn.checkpoint.sharded import is_sharded_checkpoint, load_model_weights
from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError
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


def _running(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _replacing(path: Path) -> int | None:
    """The process id of a live writer that has renamed ``path`` aside (``.NAME.old-PID``,
    where the system cannot exchange two folders: aiayn/atomic.py) and is about to rename the
    new folder into place; None when there is none.  This process's own copies do not count:
    a replace in this process has ended (or failed) by the time it reads."""
    for old in path.parent.glob(f".{path.name}{OLD_MARK}*"):
        pid = old.name.rpartition(OLD_MARK)[2]
        if pid.isdigit() and int(pid) != os.getpid() and _running(int(pid)):
            return int(pid)
    return None


def checked_folder(directory: str | os.PathLike[str], what: str = "saved model") -> Path:
    """``directory`` as a Path, after the manifest check.  A reader deletes nothing (a writer
    may be filling its temporary neighbours), and puts back a folder renamed aside only when
    the process that renamed it is gone: a crash left it there, not a replace under way
    (aiayn/checkpoint/run_lock.py)."""
    path = Path(directory)
    if not path.exists() and (writer := _replacing(path)) is not None:
        raise CheckpointError(
            f"{path} is being replaced by process {writer}: try again in a moment"
        )
    recover(path, remove=False)
    if not path.is_dir():
        raise CheckpointError(f"no {what} at {path}: not a folder")
    verify_manifest(path)
    return path


def read_config(directory: str | os.PathLike[str]) -> ModelConfig:
    """The ModelConfig stored in a model folder (nothing else is read)."""
    path = Path(directory)
    if not path.is_dir():
        raise CheckpointError(f"no saved model at {path}: not a folder")
    cfg = path / CONFIG_FILE
    if not cfg.is_file():
        raise CheckpointError(f"no saved model at {path}: {CONFIG_FILE} is missing")
    try:
        return ModelConfig.from_json(cfg.read_text())
    except (ValueError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"corrupt model config {cfg}: {err}") from err


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
        raise CheckpointError(f"no saved model at {path}: {WEIGHTS_FILE} is missing")
    model = build_model(config)
    try:
        missing, unexpected = read_weights(model, str(weights), strict=False, device=device)
    except (SafetensorError, OSError, RuntimeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"corrupt weights file {weights}: {err}") from err
    if missing or unexpected:
        raise CheckpointError(
            f"weights in {weights} do not match the config: missing {sorted(missing)[:5]},"
            f" unexpected {sorted(unexpected)[:5]}"
        )
    return model.to(device)
