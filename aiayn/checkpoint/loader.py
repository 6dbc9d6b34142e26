"""The one loader: ``load`` reads any folder a user names as a ``Bundle``.

Three kinds of folder hold a model with its tokenizer, and ``load`` tells them apart:

* an aiayn checkpoint -- config.json (a ModelConfig), model.safetensors, tokenizer.json,
  run.json (aiayn/checkpoint/bundle.py);
* a training run's folder -- its current checkpoint, the one ``checkpoint`` points at
  (aiayn/checkpoint/run_dir.py);
* a Hugging Face folder -- config.json names a ``model_type``; read in place by its family's
  adapter (aiayn/interop/hf_folder.py, aiayn/interop/families.py).

Every command, the server, the explorer, the pictures and fine-tuning's ``init_from`` load
through it; ``read_model_config`` reads only the architecture of the same folders.  A
model saved alone (``aiayn.save``: no tokenizer) is read with
``load_model``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aiayn.checkpoint.bundle import Bundle, read_bundle, save_bundle
from aiayn.checkpoint.model import CONFIG_FILE, read_config
from aiayn.checkpoint.run_dir import RunDir
from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError

KINDS = (
    "an aiayn checkpoint (config.json + tokenizer.json), a training run's folder (with"
    " checkpoint/) or a Hugging Face folder (config.json with a model_type)"
)


def is_hf_folder(directory: str | os.PathLike[str]) -> bool:
    """A Hugging Face checkpoint folder: its config.json names a ``model_type`` (an aiayn
    checkpoint's config.json is a ModelConfig, which has none)."""
    cfg = Path(directory) / CONFIG_FILE
    try:
        return cfg.is_file() and "model_type" in json.loads(cfg.read_text())
    except (ValueError, UnicodeDecodeError):
        return False


def checkpoint_of(path: str | os.PathLike[str]) -> Path:
    """The folder whose weights ``path`` names: ``path`` itself, or the current checkpoint of
    the training run ``path`` is the folder of."""
    folder = Path(path)
    if (folder / CONFIG_FILE).exists() or not folder.is_dir():
        return folder  # a checkpoint; or nothing, which reading it will name
    run = RunDir(folder)
    if run.pointer.exists():
        return run.pointer
    latest = run.latest()
    if latest is not None:
        return latest
    if run.holds_run():
        raise CheckpointError(f"no checkpoint at {folder}: the training run holds none yet")
    raise CheckpointError(f"no checkpoint at {folder}: {CONFIG_FILE} is missing (expected {KINDS})")


def load(path: str | os.PathLike[str], *, device: str = "cpu") -> Bundle:
    """Model, tokenizer and run config of the checkpoint, run folder or Hugging Face folder
    ``path`` (module docstring), every file checked; the model on ``device``."""
    folder = checkpoint_of(path)
    if not is_hf_folder(folder):
        return read_bundle(folder, device=device)
    from aiayn.interop.hf_folder import load_hf

    model, tokenizer, run = load_hf(folder)
    return Bundle(model.to(device), tokenizer, run, folder)


def read_model_config(path: str | os.PathLike[str]) -> ModelConfig:
    """The ModelConfig of what ``load`` would read at ``path``, without its weights."""
    folder = checkpoint_of(path)
    if not is_hf_folder(folder):
        return read_config(folder)
    from aiayn.interop.hf_folder import read_hf_config

    return read_hf_config(folder)


def convert_from_hf(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """An HF checkpoint folder as an aiayn checkpoint (model, tokenizer, run.json): what
    ``aiayn generate``, ``evaluate`` and ``explore`` read."""
    from aiayn.interop.hf_folder import load_hf_folder
    from aiayn.interop.hf_tokenizer import load_hf_tokenizer

    model = load_hf_folder(directory)
    tokenizer = load_hf_tokenizer(directory)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise CheckpointError(
            f"the tokenizer has {tokenizer.vocab_size} tokens, more than the model's"
            f" vocab_size={model.config.vocab_size}"
        )
    run = {"model": model.config.to_dict(), "source": {"huggingface": str(Path(directory))}}
    return save_bundle(out, model, tokenizer, run)
