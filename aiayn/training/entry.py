"""``aiayn.train``: a training run from its config, whatever the model -- the library
call that ``aiayn train`` makes.

>>> import aiayn
>>> result = aiayn.train("configs/shakespeare_char.toml", "runs/shakespeare_char")
>>> result.val_loss, result.checkpoint

The model's architecture picks the task: a decoder trains as a language model, an
encoder-decoder on translation pairs, an encoder as a masked language model, a Vision
Transformer on images.  Launched by ``torchrun`` (``WORLD_SIZE`` > 1), it joins the process
group (NCCL on a GPU, gloo on a CPU) and leaves it when the run ends.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aiayn.config.run import RunConfig
from aiayn.data.files import data_dir
from aiayn.errors import ConfigError
from aiayn.training.config import load_run_config
from aiayn.training.loop import FitResult


def _trainer(run: RunConfig) -> Callable[..., FitResult]:
    """The task's training function for ``run``'s model."""
    from aiayn.training.lm import train_lm
    from aiayn.training.masked_lm import train_masked_lm
    from aiayn.training.translate import train_translation
    from aiayn.training.vision import train_vision

    if run.model.vision.image_size is not None:
        return train_vision
    trainers = {
        "decoder": train_lm,
        "encoder-decoder": train_translation,
        "encoder": train_masked_lm,
    }
    if run.model.arch not in trainers:
        raise ConfigError(f"aiayn trains no task for arch={run.model.arch!r} yet")
    return trainers[run.model.arch]


def train(
    config: str | os.PathLike[str] | RunConfig,
    out: str | os.PathLike[str],
    *,
    data: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> FitResult:
    """Train the run ``config`` describes (a TOML file, or a ``RunConfig``) into the run
    folder ``out``.  ``data``: the folder the config's data paths are relative to (default
    ``$AIAYN_DATA``); ``overrides``: dotted settings over the file's (``{"train.max_steps":
    100}``, as ``--set`` gives them); ``resume`` continues the run in ``out``, ``overwrite``
    replaces it."""
    if isinstance(config, RunConfig):
        if overrides:
            raise ConfigError("overrides apply to a config file; change the RunConfig instead")
        run = config
    else:
        run = load_run_config(Path(config), dict(overrides or {}))
    fit = _trainer(run)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():  # torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        return fit(run, out, data_dir(data), resume=resume, overwrite=overwrite)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
