"""The typed configuration of a training run, as a TOML file holds it in three tables::

[model]   preset = "gpt2-small" and any ModelConfig fields to override
[data]    text = "tinyshakespeare/input.txt" (relative to the data folder), tokenizer, ...
[train]   the TrainConfig fields below

``RunConfig`` is what training writes into a run's folder and what ``inspect`` and ``explore``
read back; ``aiayn.training.config.load_run_config`` reads a file into one (it resolves a
preset or an ``init_from`` checkpoint, which needs the layers above this one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from aiayn.config.model import ModelConfig
from aiayn.config.validate import check_field_types
from aiayn.errors import ConfigError


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int = 2000
    batch_size: int = 12
    block_size: int = 64
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float | None = 1.0
    eval_interval: int = 250
    eval_batches: int = 20
    checkpoint_interval: int = 500
    seed: int = 1337
    # Autocast precision: "auto" is bf16 on GPUs that have it, and on CPUs whose bf16 units
    # measure faster than fp32 here (aiayn/device.py); float16 adds a gradient scaler.
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    device: str = "auto"  # "auto" (a GPU when there is one), "cpu", "cuda", "cuda:N"
    parallel: Literal["ddp", "fsdp"] = "ddp"  # several processes: replicate, or shard (FSDP2)
    # "full": one safetensors file and one optimizer state, gathered on rank 0; "sharded":
    # every rank writes its shard (torch.distributed.checkpoint); "auto": sharded when the
    # model is (FSDP over several processes).  Either resumes on any number of processes.
    checkpoint_format: Literal["auto", "full", "sharded"] = "auto"
    compile: bool = False
    threads: int | None = None
    schedule: Literal["cosine", "paper"] = "cosine"  # "paper": Eq. (3) of §5.3, lr = its factor
    adam_eps: float = 1e-8
    label_smoothing: float = 0.0  # §5.4: 0.1
    max_tokens: int | None = None  # token-count batches (per side, padding included)
    keep_snapshots: int = 0  # model snapshots kept for checkpoint averaging (§6.1: 5)
    snapshot_fraction: float = 0.1  # ... spread evenly over this last part of the run
    # Wall-clock budget: checkpoint and stop when spent.  A run's result then depends on the
    # host's speed, so no shipped config sets it; results users compare are fixed steps.
    max_minutes: float | None = None
    moe_aux_weight: float = 0.01  # weight of the MoE load-balancing loss (Switch: 0.01)
    on_nonfinite: Literal["stop", "skip"] = "stop"  # a NaN/inf loss or gradient: stop, or
    # skip that step's update (the last good checkpoint stays either way)
    # CPU fp32 linear layers: "auto" measures oneDNN against MKL at the run's start (for
    # fixed-shape batches) and keeps the faster; a resumed run keeps its start's choice.
    linear_kernel: Literal["auto", "mkl", "onednn"] = "auto"

    def __post_init__(self) -> None:
        check_field_types(self)  # the Literal fields' choices too
        for name in (
            "max_steps",
            "batch_size",
            "block_size",
            "grad_accum",
            "eval_interval",
            "eval_batches",
            "checkpoint_interval",
        ):
            v = getattr(self, name)
            if v < 1:  # an int: check_field_types has seen to the type
                raise ConfigError(
                    f"TrainConfig.{name}={v!r} is invalid: expected a positive integer"
                )
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(
                f"TrainConfig lr={self.lr}, min_lr={self.min_lr}: expected 0 <= min_lr <= lr, lr > 0"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(
                f"TrainConfig.label_smoothing={self.label_smoothing} must be in [0, 1)"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(
                f"TrainConfig.max_tokens={self.max_tokens} must be a positive integer"
            )
        if self.keep_snapshots < 0:
            raise ConfigError(f"TrainConfig.keep_snapshots={self.keep_snapshots} must be >= 0")
        if not 0.0 < self.snapshot_fraction <= 1.0:
            raise ConfigError(
                f"TrainConfig.snapshot_fraction={self.snapshot_fraction} must be in (0, 1]"
            )
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"TrainConfig.max_minutes={self.max_minutes} must be > 0 or absent")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"TrainConfig.grad_clip={self.grad_clip} must be > 0 or absent")


@dataclass(frozen=True)
class DataConfig:
    """Where the data is (paths relative to the data folder) and how to tokenize it.

    Language models read ``text``.  Translation reads Multi30k (``source_lang`` ->
    ``target_lang``) unless ``train_source`` etc. name line-aligned files of your own.
    ``shards`` names token shards made by ``aiayn preprocess`` instead (a folder, relative to
    the data folder or absolute): the run then reads its tokens and tokenizer from there, and
    the files and tokenizer settings above are not used.
    """

    text: str = "tinyshakespeare/input.txt"
    tokenizer: Literal["char", "bpe"] = "char"
    bpe_vocab_size: int = 4096
    train_fraction: float = 0.9
    source_lang: str = "de"
    target_lang: str = "en"
    train_source: str | None = None
    train_target: str | None = None
    valid_source: str | None = None
    valid_target: str | None = None
    shards: str | None = None
    images: str = "digits"  # an image model's dataset (aiayn/data/images.py)
    test_fraction: float = 0.2  # ... held out from training: the test set
    seed: int = 0  # ... of its stratified train / validation / test split

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.tokenizer not in ("char", "bpe"):
            raise ConfigError(
                f"DataConfig.tokenizer={self.tokenizer!r} is invalid: expected 'char' or 'bpe'"
            )
        for split in ("train", "valid"):  # own files come in pairs: a side alone is a mistake
            source, target = getattr(self, f"{split}_source"), getattr(self, f"{split}_target")
            if (source is None) != (target is None):
                given, missing = ("source", "target") if target is None else ("target", "source")
                raise ConfigError(
                    f"DataConfig.{split}_{given} is set but {split}_{missing} is not: give both"
                    " files of the pair, or neither (Multi30k)"
                )


@dataclass(frozen=True)
class RunConfig:
    """A training run: the model, its data, how to train it, and ``init_from``: the folder (a
    Hugging Face checkpoint or an aiayn one) whose weights and tokenizer the run starts from
    (fine-tuning; None trains from scratch)."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    init_from: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(),
            "data": dataclasses.asdict(self.data),
            "train": dataclasses.asdict(self.train),
            "init_from": self.init_from,
        }
