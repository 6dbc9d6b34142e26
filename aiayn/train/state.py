"""Resumable training checkpoints: a typed record, written atomically.

A checkpoint folder holds everything needed to continue a run exactly where it stopped::

    config.json, model.safetensors   the model (see aiayn/checkpoint.py)
    tokenizer.json                   the tokenizer the ids mean something in
    run.json                         the run's model/data/train configuration
    train_state.pt                   step, optimizer moments, RNG states, data position

``train_state.pt`` holds only tensors, numbers and strings, and is read with
``torch.load(weights_only=True)``: nothing is unpickled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoint import load, write_atomically, write_model
from aiayn.data.tokenizer import Tokenizer, load_tokenizer
from aiayn.models import TransformerModel

STATE_FILE = "train_state.pt"
TOKENIZER_FILE = "tokenizer.json"
RUN_FILE = "run.json"


@dataclass
class TrainState:
    step: int
    optimizer: dict[str, Any]
    torch_rng: torch.Tensor
    data: dict[str, Any]  # the task's data position (generator states, epoch, batch index)
    history: list[dict[str, float]] = field(default_factory=list)


def _write_inference_files(
    folder: Path, model: TransformerModel, tokenizer: Tokenizer, run: dict[str, Any]
) -> None:
    write_model(model, folder)
    tokenizer.save(folder / TOKENIZER_FILE)
    (folder / RUN_FILE).write_text(json.dumps(run, indent=2))


def save_checkpoint(
    directory: Path,
    model: TransformerModel,
    tokenizer: Tokenizer,
    run: dict[str, Any],
    state: TrainState,
) -> Path:
    """Everything to resume: the model, tokenizer and run config, and the training state."""

    def fill(tmp: Path) -> None:
        _write_inference_files(tmp, model, tokenizer, run)
        torch.save(
            {
                "step": state.step,
                "optimizer": state.optimizer,
                "torch_rng": state.torch_rng,
                "data": state.data,
                "history": state.history,
            },
            tmp / STATE_FILE,
        )

    return write_atomically(directory, fill)


def save_snapshot(
    directory: Path, model: TransformerModel, tokenizer: Tokenizer, run: dict[str, Any]
) -> Path:
    """A checkpoint without the training state: enough to translate, evaluate or average."""
    return write_atomically(
        directory, lambda tmp: _write_inference_files(tmp, model, tokenizer, run)
    )


def load_for_inference(directory: Path) -> tuple[TransformerModel, Tokenizer]:
    """Model and tokenizer only: what generation, evaluation and the explorer need."""
    model = load(directory)
    tok_path = Path(directory) / TOKENIZER_FILE
    if not tok_path.is_file():
        raise ValueError(f"checkpoint {directory} has no {TOKENIZER_FILE}")
    return model, load_tokenizer(tok_path)


def load_run(directory: Path) -> dict[str, Any]:
    """The run config a checkpoint was trained with ({} if it has none)."""
    run_path = Path(directory) / RUN_FILE
    return json.loads(run_path.read_text()) if run_path.is_file() else {}


def load_checkpoint(
    directory: Path,
) -> tuple[TransformerModel, Tokenizer, dict[str, Any], TrainState | None]:
    """Model, tokenizer, run config and (if present) the training state."""
    model, tokenizer = load_for_inference(directory)
    run = load_run(directory)
    state = None
    state_path = Path(directory) / STATE_FILE
    if state_path.is_file():
        try:
            raw = torch.load(state_path, weights_only=True)
            state = TrainState(
                raw["step"], raw["optimizer"], raw["torch_rng"], raw["data"], raw["history"]
            )
        except Exception as err:
            raise ValueError(f"corrupt training state {state_path}: {err}") from err
    return model, tokenizer, run, state
