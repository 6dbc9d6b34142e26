"""Everything that reads or writes a folder of weights: one home, below all that loads.

* :mod:`~aiayn.checkpoint.atomic` -- writing a folder so that a crash at any instant loses
  nothing (temporary folder, fsync, manifest with SHA-256, atomic rename or exchange).
* :mod:`~aiayn.checkpoint.model` -- a model: config.json + model.safetensors.
* :mod:`~aiayn.checkpoint.bundle` -- a model with its tokenizer and run config, as every
  trained checkpoint is; what generation, evaluation, the pictures and the explorer load.
* :mod:`~aiayn.checkpoint.run_dir` -- a training run's folder: step checkpoints behind an
  atomically switched pointer, snapshots for averaging, the log, crash recovery.
"""

from aiayn.checkpoint.bundle import (
    RUN_FILE,
    TOKENIZER_FILE,
    Bundle,
    is_bundle,
    load_bundle,
    read_run,
    save_bundle,
    save_with_companions,
)
from aiayn.checkpoint.model import CONFIG_FILE, WEIGHTS_FILE, load, read_config, save
from aiayn.checkpoint.run_dir import RunDir, TrainState

__all__ = [
    "CONFIG_FILE",
    "RUN_FILE",
    "TOKENIZER_FILE",
    "WEIGHTS_FILE",
    "Bundle",
    "RunDir",
    "TrainState",
    "is_bundle",
    "load",
    "load_bundle",
    "read_config",
    "read_run",
    "save",
    "save_bundle",
    "save_with_companions",
]
