"""Everything that reads or writes a folder of weights: one home, below all that loads.

* ``loader`` -- ``load``, the one loader: an aiayn checkpoint, a
  training run's folder (its current checkpoint) or a Hugging Face folder, as a
  ``Bundle``; what every command, the server and the explorer load through.
* ``atomic`` (below every layer, since data shards use it too) -- writing a
  folder so that a crash at any instant loses nothing (temporary folder, fsync, manifest with
  SHA-256, atomic rename or exchange).
* ``model`` -- a model alone: config.json + model.safetensors
  (``save``, ``load_model``).
* ``bundle`` -- a model with its tokenizer and run config, as every
  trained checkpoint is.
* ``run_dir`` -- a training run's folder: step checkpoints behind an
  atomically switched pointer, snapshots for averaging, the log, crash recovery.
"""

from aiayn.checkpoint.bundle import (
    RUN_FILE,
    TOKENIZER_FILE,
    Bundle,
    is_bundle,
    read_run,
    save_bundle,
    save_with_companions,
)
from aiayn.checkpoint.loader import convert_from_hf, is_hf_folder, load, read_model_config
from aiayn.checkpoint.model import CONFIG_FILE, WEIGHTS_FILE, load_model, read_config, save
from aiayn.checkpoint.run_dir import RunDir, TrainState

__all__ = [
    "CONFIG_FILE",
    "RUN_FILE",
    "TOKENIZER_FILE",
    "WEIGHTS_FILE",
    "Bundle",
    "RunDir",
    "TrainState",
    "convert_from_hf",
    "is_bundle",
    "is_hf_folder",
    "load",
    "load_model",
    "read_config",
    "read_model_config",
    "read_run",
    "save",
    "save_bundle",
    "save_with_companions",
]
