"""A model with what gives it meaning: its tokenizer and the run config it was trained with.

Every trained checkpoint, snapshot and average is such a folder::

    config.json, model.safetensors   the model (aiayn/checkpoint/model.py)
    tokenizer.json                   the tokenizer the ids mean something in
    run.json                         the run's model/data/train configuration
    manifest.json                    sizes and SHA-256 of the files above

``read_bundle`` is the one place that reads them; every command, the server, the
explorer and the library read a checkpoint through ``aiayn.checkpoint.load``
(aiayn/checkpoint/loader.py), which also takes a run folder or a Hugging Face folder.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.atomic import write_atomically
from aiayn.checkpoint.model import (
    CONFIG_FILE,
    checked_folder,
    load_model,
    read_config,
    write_model,
)
from aiayn.data.tokenizer import Tokenizer, load_tokenizer
from aiayn.errors import CheckpointError
from aiayn.models import TransformerModel, build_model

TOKENIZER_FILE = "tokenizer.json"
RUN_FILE = "run.json"
COMPANION_FILES = (TOKENIZER_FILE, RUN_FILE)  # what travels with a model between folders


@dataclass
class Bundle:
    model: TransformerModel
    tokenizer: Tokenizer
    run: dict[str, Any]  # {} when the folder has no run.json
    directory: Path


def is_bundle(folder: Path) -> bool:
    return (folder / CONFIG_FILE).is_file() and (folder / TOKENIZER_FILE).is_file()


def write_bundle_files(
    folder: Path, model: TransformerModel, tokenizer: Tokenizer, run: dict[str, Any]
) -> None:
    """Write the model, tokenizer and run config into an existing (temporary) folder."""
    write_model(model, folder)
    tokenizer.save(folder / TOKENIZER_FILE)
    (folder / RUN_FILE).write_text(json.dumps(run, indent=2))


def save_bundle(
    directory: str | os.PathLike[str],
    model: TransformerModel,
    tokenizer: Tokenizer,
    run: dict[str, Any],
) -> Path:
    """Model, tokenizer and run config, written atomically."""
    return write_atomically(
        Path(directory), lambda tmp: write_bundle_files(tmp, model, tokenizer, run)
    )


def read_run(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The run config a checkpoint was trained with ({} if it has none)."""
    path = Path(directory) / RUN_FILE
    if not path.is_file():
        return {}
    try:
        run = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"corrupt run config {path}: {err}") from err
    if not isinstance(run, dict):
        raise CheckpointError(f"corrupt run config {path}: expected a JSON object")
    return run


def read_bundle(
    directory: str | os.PathLike[str],
    *,
    device: str = "cpu",
    weights: bool = True,
    verified: bool = False,
) -> Bundle:
    """Model, tokenizer and run config of a checkpoint folder, every file checked (unless the
    caller has just done so: ``verified``).  With ``weights=False`` the model is built from
    its config but not filled (a sharded training run resumes its weights from the shards,
    after the model is sharded)."""
    path = Path(directory) if verified else checked_folder(directory, "checkpoint")
    model = (
        load_model(path, device=device) if weights else build_model(read_config(path)).to(device)
    )
    tok_path = path / TOKENIZER_FILE
    if not tok_path.is_file():
        raise CheckpointError(
            f"checkpoint {path} has no {TOKENIZER_FILE} (a model saved alone, with aiayn.save,"
            " is read with aiayn.load_model)"
        )
    try:
        tokenizer = load_tokenizer(tok_path)
    except Exception as err:  # json, KeyError, or the tokenizers library's own errors
        raise CheckpointError(f"corrupt tokenizer file {tok_path}: {err}") from err
    return Bundle(model, tokenizer, read_run(path), path)


def save_with_companions(
    model: TransformerModel, directory: str | os.PathLike[str], source: str | os.PathLike[str]
) -> Path:
    """Save ``model`` with the tokenizer and run config of the checkpoint ``source`` (what
    averaging does, so that an average translates and evaluates directly)."""
    src = Path(source)

    def fill(tmp: Path) -> None:
        write_model(model, tmp)
        for name in COMPANION_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)

    return write_atomically(Path(directory), fill)
