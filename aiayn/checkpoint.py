"""Saving and loading models: weights in safetensors, config in JSON, written atomically.

A saved model is a folder::

    config.json        the ModelConfig (self-describing: enough to rebuild the model)
    model.safetensors  the weights (tied tensors stored once; never pickled)

The folder is first written under a temporary name beside the target and then renamed into
place, so a crash leaves either the old folder or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_model, save_model

from aiayn.config import ModelConfig
from aiayn.models import TransformerModel, build_model

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def atomic_dir(target: Path) -> Path:
    """A fresh temporary folder beside ``target`` (same filesystem, so rename is atomic)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))


def commit_dir(tmp: Path, target: Path) -> None:
    """Move ``tmp`` into place as ``target``, replacing an old folder only after success."""
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


def write_atomically(target: Path, fill: Callable[[Path], None]) -> Path:
    """Let ``fill`` write a temporary folder, then rename it to ``target``; on any failure the
    temporary folder is removed and an existing ``target`` is left untouched."""
    if target.exists() and not target.is_dir():
        raise ValueError(f"cannot write to {target}: it exists and is not a folder")
    tmp = atomic_dir(target)
    try:
        fill(tmp)
        commit_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def write_model(model: TransformerModel, folder: Path) -> None:
    """Write config.json and model.safetensors into an existing (temporary) folder."""
    (folder / CONFIG_FILE).write_text(model.config.to_json())
    save_model(model, str(folder / WEIGHTS_FILE), metadata={"format": "pt", "library": "aiayn"})


def save(model: TransformerModel, directory: str | os.PathLike[str]) -> Path:
    """Write ``model`` to ``directory`` (config.json + model.safetensors), atomically."""
    return write_atomically(Path(directory), lambda tmp: write_model(model, tmp))


def load_config(directory: str | os.PathLike[str]) -> ModelConfig:
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


def load(directory: str | os.PathLike[str], *, device: str = "cpu") -> TransformerModel:
    """Rebuild the model saved in ``directory`` and load its weights (strictly)."""
    path = Path(directory)
    config = load_config(path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise ValueError(f"no saved model at {path}: {WEIGHTS_FILE} is missing")
    model = build_model(config)
    try:
        missing, unexpected = load_model(model, str(weights), strict=False, device=device)
    except (SafetensorError, OSError, RuntimeError, json.JSONDecodeError) as err:
        raise ValueError(f"corrupt weights file {weights}: {err}") from err
    if missing or unexpected:
        raise ValueError(
            f"weights in {weights} do not match the config: missing {sorted(missing)[:5]},"
            f" unexpected {sorted(unexpected)[:5]}"
        )
    return model.to(device)
