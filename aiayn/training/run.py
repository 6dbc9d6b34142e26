"""A training run from its config, the skeleton every task shares: ``train_run`` holds the
run folder's writer lock and the run's threads, opens or resumes the run (checking a resumed
run's model against the one configured), builds the model and tokenizer if new, makes the
task and calls ``fit`` (aiayn/training/loop.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from aiayn.checkpoint.run_dir import TrainState
from aiayn.checkpoint.run_lock import writer_lock
from aiayn.config import ModelConfig, differing_fields
from aiayn.config.run import RunConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError
from aiayn.models import DecoderLM, EncoderLM, TransformerModel
from aiayn.training.loop import FitResult, fit, open_run, world_info
from aiayn.training.task import Task

FROM_DATA = (
    "vocab_size",
    "src_vocab_size",
    "pad_id",
    "max_len",
    "vision.image_size",
    "vision.channels",
    "vision.n_classes",
)


def _check_same_model(wanted: ModelConfig, saved: ModelConfig, root: Path) -> None:
    """A resumed run continues the model in its checkpoint: a [model] that now asks for
    another one (more layers, another width) is an error naming what differs, not silently
    ignored.  [train] may change (more steps, another learning rate)."""
    differ = [
        f"{name}={wanted.value(name)!r} (the checkpoint has {saved.value(name)!r})"
        for name in differing_fields(wanted, saved, skip=FROM_DATA)
    ]
    # max_len is set from the data too (a language model's grows to its block), so only a
    # [model] asking for more positions than the checkpoint has is another model.
    if wanted.max_len > saved.max_len:
        differ.append(f"max_len={wanted.max_len} (the checkpoint has {saved.max_len})")
    if differ:
        raise UserError(
            f"--resume continues the model in {root}, but [model] asks for another:"
            f" {', '.join(differ)}; start a new run (another --out, or --overwrite)"
        )


def train_run(
    run: RunConfig,
    out_dir: str | Path,
    *,
    resume: bool,
    overwrite: bool,
    build: Callable[[], tuple[TransformerModel, Tokenizer]],
    make_task: Callable[[TransformerModel, Tokenizer], Task],
    model_type: type[TransformerModel],
    stop_after: int | None,
    progress: bool,
) -> tuple[FitResult, Task]:
    """The skeleton every task shares: open (or resume) the run, build the model and
    tokenizer if new, make the task, fit."""
    if run.init_from is not None and model_type not in (DecoderLM, EncoderLM):
        raise UserError(
            f"[model] init_from: starting from a checkpoint is built for language models"
            f" (decoder-only, and encoders' masked-LM training); this run trains a"
            f" {model_type.__name__} (train it from scratch)"
        )
    if run.model.quantization is not None:
        raise UserError(
            f"model.quantization={run.model.quantization!r}: int8 weights are for decoding and"
            " do not train; train (or fine-tune) the fp32 model, then aiayn convert --quantize"
        )
    with _threads(run.train.threads), _one_writer(out_dir):
        rd, resumed = open_run(run.train, out_dir, resume=resume, overwrite=overwrite)
        state: TrainState | None = None
        if resumed is not None:
            model, tokenizer, state = resumed
            if not isinstance(model, model_type):
                raise UserError(
                    f"{rd.latest()} holds a {type(model).__name__}; this run trains a"
                    f" {model_type.__name__}"
                )
            _check_same_model(run.model, model.config, rd.root)
        else:
            torch.manual_seed(run.train.seed)
            model, tokenizer = build()
            if not isinstance(model, model_type):
                raise UserError(
                    f"arch={model.config.arch!r} builds a {type(model).__name__}; this task"
                    f" trains a {model_type.__name__}"
                )
        task = make_task(model, tokenizer)
        result = fit(
            model,
            task,
            run,
            rd,
            tokenizer=tokenizer,
            state=state,
            stop_after=stop_after,
            progress=progress,
        )
        return result, task


@contextmanager
def _one_writer(out_dir: str | Path) -> Iterator[None]:
    """The run folder's writer lock for the block (aiayn/checkpoint/run_lock.py), held by rank
    0, which writes the files every rank shares.  Every rank learns whether rank 0 got it: a
    refused run fails on every rank, naming the holder, instead of leaving the other ranks
    waiting for rank 0 at the next barrier."""
    rank, world = world_info()
    with ExitStack() as held:
        refusal: list[Exception | None] = [None]
        if rank == 0:
            try:
                held.enter_context(writer_lock(out_dir))
            except (ValueError, OSError) as err:  # RunFolderLocked, or no lock file to open
                refusal[0] = err
        if world > 1:
            dist.broadcast_object_list(refusal, src=0, device=_staging_device())
        if refusal[0] is not None:
            raise refusal[0]
        yield


def _staging_device() -> torch.device | None:
    """Where an object collective stages its bytes before ``fit`` has given this process its
    GPU: with NCCL this rank's own, the one torchrun's LOCAL_RANK names (as ``local_device``
    does; two ranks on one GPU fail); with gloo, the CPU (None)."""
    if dist.get_backend() == dist.Backend.NCCL:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return None


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` (``train.threads``) for the run, and given back
    after it: a run started from Python leaves the caller's setting as it found it."""
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
