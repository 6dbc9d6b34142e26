"""The training loop, shared by every task; it knows nothing about what the model is.

A ``Task`` supplies batches, the loss of a batch, a validation loss and
its data position.  The loop puts the pieces together: ``open_run`` checks and repairs the
run folder and loads what a resumed run continues from; a ``Trainer`` (built and run
by ``fit``) runs the steps (aiayn/training/step.py), logs them (aiayn/training/logger.py), and
writes checkpoints and snapshots when aiayn/training/policy.py says so, into the run folder of
aiayn/checkpoint/run_dir.py.  A run killed at any instant and resumed continues with the same
batches, dropout masks and learning rates as one that never stopped, and ends with the same
weights, bit for bit (tests/training/test_faults.py).

Devices and precision: ``train.device`` (a GPU when there is one, by default) holds the model,
its optimizer state and the batches; ``train.dtype`` sets autocast (bf16, or fp16 with a
gradient scaler).  Several processes: launched by ``torchrun``, the loop wraps the model in
DistributedDataParallel or shards it with FSDP2 (aiayn/training/parallel.py; gloo on CPU, nccl
on GPU).  Every step draws ``world × grad_accum`` micro-batches from the same data order on
every rank, and rank r takes its share, so two processes with ``grad_accum = a`` compute
exactly the step that one process computes with ``grad_accum = 2a``.  Only rank 0 writes logs;
checkpoints hold full CPU weights and optimizer state keyed by name, or (a sharded FSDP run)
every rank's shard through torch.distributed.checkpoint, and either resumes on any device and
any number of processes.
"""

from __future__ import annotations

import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aiayn.checkpoint.run_dir import RunDir, TrainState
from aiayn.checkpoint.sharded import load_sharded
from aiayn.config.run import RunConfig, TrainConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.device import resolve_device, resolve_dtype
from aiayn.errors import NonFiniteLoss, TrainingInterrupted, UserError
from aiayn.models import TransformerModel
from aiayn.nn import cpu_kernels
from aiayn.training.logger import RunLogger
from aiayn.training.optim import build_adamw
from aiayn.training.parallel import (
    is_sharded,
    load_optimizer_state,
    local_device,
    optimizer_state,
    saveable_model,
    wrap,
)
from aiayn.training.policy import (
    CheckpointPolicy,
    StopRequest,
    stop_on_signals,
)
from aiayn.training.schedule import lr_schedule
from aiayn.training.step import StepOutcome, TrainStep
from aiayn.training.task import Task

MAX_SKIPPED_IN_A_ROW = 10  # with on_nonfinite = "skip": this many in a row means divergence


@dataclass(frozen=True)
class FitResult:
    step: int  # the last step reached
    max_steps: int
    val_loss: float  # the final model's, evaluated at ``step``
    history: list[dict[str, float]]
    checkpoint: Path  # the run's checkpoint (the pointer to the latest)
    seconds: float  # training time of this invocation
    tokens_per_s: float  # target tokens per second of this invocation
    peak_rss_mib: float  # the process's peak resident memory so far
    already_complete: bool = False  # resumed a run that had reached max_steps
    skipped_steps: list[int] = field(default_factory=list)
    padding_fraction: float | None = None  # token-count batching (translation)

    @property
    def complete(self) -> bool:
        return self.step >= self.max_steps


def world_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes there, KiB here


def open_run(
    tc: TrainConfig, out_dir: str | Path, *, resume: bool, overwrite: bool = False
) -> tuple[RunDir, tuple[TransformerModel, Tokenizer, TrainState] | None]:
    """Check and repair the run folder; with ``resume``, load what the run continues from.

    Raises ValueError when ``resume`` finds no checkpoint, or when a fresh run would mix its
    files with an earlier run's (unless ``overwrite``, which removes the earlier run's files).
    """
    rd = RunDir(out_dir)
    rank, world = world_info()
    if not resume and rd.holds_run() and not overwrite:
        raise UserError(
            f"{rd.root} already holds a run (its checkpoint, snapshots or log.csv): continue"
            " it with --resume, or start again with --overwrite"
        )
    if rank == 0:
        rd.root.mkdir(parents=True, exist_ok=True)
        for note in rd.recover():
            print(f"{rd.root}: {note}", file=sys.stderr)
        if not resume and overwrite:
            rd.clear()
    if world > 1:
        dist.barrier()
    if not resume:
        return rd, None
    if rd.latest() is None:
        hint = (
            "it stopped before its first checkpoint: start again with --overwrite"
            if rd.holds_run()
            else "start without --resume"
        )
        raise UserError(f"nothing to resume in {rd.root}: it holds no checkpoint ({hint})")
    # A sharded run's weights are read by `fit` from its shards, each process its own part,
    # once the model is sharded: nothing here reads the whole model (rd.load(weights=False)).
    bundle, state = rd.load(weights=False)
    return rd, (bundle.model, bundle.tokenizer, state)


def _last_val(history: list[dict[str, float]]) -> float:
    return next((h["val_loss"] for h in reversed(history) if "val_loss" in h), math.nan)


def _linear_kernel(
    tc: TrainConfig,
    state: TrainState | None,
    rows: int | None,
    d: int,
    cpu_fp32: bool,
    logger: RunLogger,
) -> dict[str, str]:
    """The run's kernel choices: a resumed run keeps its own; a new one takes
    ``train.linear_kernel``, or with "auto" times oneDNN against MKL on the task's shapes
    (fp32 on a CPU) and keeps oneDNN only where it is clearly faster."""
    kernels = {} if state is None else dict(state.kernels)
    if "linear" in kernels:
        return kernels
    kernels["linear"], why = cpu_kernels.choose_training_kernel(tc.linear_kernel, rows, d, cpu_fp32)
    if why is not None:
        logger.note(why)
    return kernels


class Trainer:
    """One invocation of the training loop: the run's parts (model, task, optimizer, loss
    scaler, step, checkpoint policy, logger, run folder) and how far it has got.

    Building it puts the model on its device and wraps it, makes its optimizer, puts back a
    resumed run's state, opens the log and chooses the kernels, in that order; ``run``
    trains from ``start`` to ``end``."""

    def __init__(
        self,
        model: TransformerModel,
        task: Task,
        run: RunConfig,
        rd: RunDir,
        *,
        tokenizer: Tokenizer,
        state: TrainState | None = None,
        stop_after: int | None = None,
        progress: bool = True,
    ) -> None:
        tc = self.tc = run.train
        self.model, self.task, self.rd, self.tokenizer = model, task, rd, tokenizer
        self.rank, self.world = world_info()
        self.start, self.history = (0, []) if state is None else (state.step, state.history)
        self.device = local_device(resolve_device(tc.device), self.world)
        dtype = resolve_dtype(tc.dtype, self.device)
        model.to(self.device)
        wrapped = wrap(model, tc.parallel, self.device, self.world)
        self.optimizer = build_adamw(
            model,
            lr=tc.lr,
            weight_decay=tc.weight_decay,
            betas=(tc.beta1, tc.beta2),
            eps=tc.adam_eps,
        )
        self.scaler = torch.amp.GradScaler(self.device.type) if dtype == torch.float16 else None
        if state is not None:
            self.restore(state)
        model.train()
        if tc.compile:
            wrapped = torch.compile(wrapped)  # type: ignore[assignment]
        self.step_fn = self._make_step(wrapped, dtype)
        self.policy = CheckpointPolicy(tc)
        self.run_dict = run.to_dict() | {"model": model.config.to_dict()}
        self.end = tc.max_steps if stop_after is None else min(tc.max_steps, stop_after)
        self.logger = RunLogger(
            rd.log,
            start=self.start,
            end=self.end,
            total=tc.max_steps,
            enabled=self.rank == 0,
            progress=progress,
        )
        if dtype != torch.float32 or self.device.type != "cpu":
            self.logger.note(
                f"training on {self.device} in {str(dtype).removeprefix('torch.')} autocast"
            )
        self.kernels, self.kernel = self._choose_kernels(state, dtype)
        self.sharded = tc.checkpoint_format == "sharded" or (
            tc.checkpoint_format == "auto" and is_sharded(model)
        )
        # How far this invocation has got.
        self.done, self.tokens_seen, self.val = self.start, 0, _last_val(self.history)
        self.skipped: list[int] = []
        self.t0 = 0.0  # when run() starts

    def restore(self, state: TrainState) -> None:
        """Put back what a checkpoint saved beside the weights: the optimizer's moments, the
        random generators (dropout), the loss scaler and the task's data position -- so that a
        resumed run continues bit for bit."""
        if state.sharded:
            folder = self.rd.latest()
            assert folder is not None  # the folder ``state`` was read from
            load_sharded(folder, self.model, self.optimizer)
        else:
            load_optimizer_state(self.model, self.optimizer, state.optimizer)
        torch.set_rng_state(state.torch_rng)
        if self.device.type == "cuda" and state.cuda_rng:
            torch.cuda.set_rng_state_all(state.cuda_rng)
        if self.scaler is not None and state.scaler:
            self.scaler.load_state_dict(state.scaler)
        self.task.load_data_state(state.data)

    def _make_step(self, wrapped: torch.nn.Module, dtype: torch.dtype) -> TrainStep:
        tc = self.tc
        return TrainStep(
            self.model,
            wrapped,
            self.optimizer,
            lr_schedule(tc, self.model.config.d_model),
            self.task,
            tc,
            rank=self.rank,
            world=self.world,
            autocast=torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32),
            device=self.device,
            scaler=self.scaler,
        )

    def _choose_kernels(
        self, state: TrainState | None, dtype: torch.dtype
    ) -> tuple[dict[str, str], str]:
        """The run's kernel choices (saved with it) and the linear kernel this invocation trains
        on: oneDNN's unpacked path is for fp32 on CPUs; elsewhere the choice is kept but unused."""
        cpu_fp32 = self.device.type == "cpu" and dtype == torch.float32
        rows, d = self.task.linear_rows, self.model.config.d_model
        kernels = _linear_kernel(self.tc, state, rows, d, cpu_fp32, self.logger)
        return kernels, kernels["linear"] if cpu_fp32 else "mkl"

    def run(self) -> FitResult:
        """Train from ``start`` to ``end`` (or until ``train.max_minutes`` or a signal).

        The order of a step's work below -- the update, the stop flags, evaluation, the log
        row, the checkpoint, the snapshot, then stopping -- is the crash-safety contract of a
        run (tests/training/test_faults.py), kept in one place."""
        end, policy = self.end, self.policy
        self.t0 = time.perf_counter()
        try:
            with stop_on_signals() as stop, cpu_kernels.for_training(self.model, self.kernel):
                for step in range(self.start, end):
                    outcome = self.step_fn(step)
                    self.done = done = step + 1
                    if not outcome.finite:
                        self._skip_or_stop(outcome.loss)
                    self.tokens_seen += outcome.tokens
                    elapsed = time.perf_counter() - self.t0
                    out_of_time, stopping = self._stop_flags(elapsed, stop)
                    last = done == end or out_of_time
                    evaluate = not stopping and (policy.evaluation_due(done, end) or last)
                    self._record(outcome, evaluate, elapsed)
                    if policy.checkpoint_due(done, end) or last or stopping:
                        self.checkpoint()
                    if policy.snapshot_due(done):
                        self.snapshot()
                    if stopping:
                        raise TrainingInterrupted(done, stop.name or "stop", str(self.rd.pointer))
                    if out_of_time:
                        self.logger.note(
                            f"max_minutes={self.tc.max_minutes} spent: stopped at step {done}"
                        )
                        break
        finally:
            self.logger.close()
        return self._result()

    def _skip_or_stop(self, loss: float) -> None:
        """A step whose loss or gradient was not finite: note the skipped update, or stop the
        run (``train.on_nonfinite = "stop"``, or too many skipped in a row) naming the step."""
        done, skipped = self.done, self.skipped
        skipped.append(done)
        what = f"the loss or gradient became {loss} at step {done}"
        in_a_row = list(range(done - MAX_SKIPPED_IN_A_ROW + 1, done + 1))
        if self.tc.on_nonfinite == "stop" or skipped[-MAX_SKIPPED_IN_A_ROW:] == in_a_row:
            raise NonFiniteLoss(
                f"{what}; training stopped, the last good checkpoint is"
                f" {self.rd.latest() or 'not written yet'} (lower the learning rate,"
                " or set train.on_nonfinite = 'skip')"
            )
        self.logger.note(f"{what}: the update was skipped")

    def _stop_flags(self, elapsed: float, stop: StopRequest) -> tuple[bool, bool]:
        """Whether to stop (time spent; a signal): with several processes, every rank stops at
        the same step if any one must."""
        max_minutes = self.tc.max_minutes
        out_of_time = max_minutes is not None and elapsed > 60 * max_minutes
        stopping = stop.signum is not None
        if self.world > 1:
            flags = torch.tensor([float(out_of_time), float(stopping)])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            out_of_time, stopping = bool(flags[0]), bool(flags[1])
        return out_of_time, stopping

    def evaluate(self) -> float:
        """The validation loss of the model as it is now."""
        self.val = self.task.evaluate(self.model)
        return self.val

    def _record(self, outcome: StepOutcome, evaluate: bool, elapsed: float) -> None:
        """The step's row in the history and the log (with the validation loss when due)."""
        record: dict[str, float] = {"step": self.done, "loss": outcome.loss, "lr": outcome.lr}
        if evaluate:
            val = self.evaluate()
            record["val_loss"] = val
            record["val_ppl"] = math.exp(min(val, 50.0))  # perplexity
        self.history.append(record)
        self.logger.row(
            self.done, outcome.loss, outcome.lr, record.get("val_loss"), self.tokens_seen / elapsed
        )

    def _train_state(self, moments: dict[str, Any]) -> TrainState:
        scaler, cuda = self.scaler, self.device.type == "cuda"
        return TrainState(
            self.done,
            moments,
            torch.get_rng_state(),
            self.task.data_state(),
            self.history,
            scaler={} if scaler is None else scaler.state_dict(),
            cuda_rng=torch.cuda.get_rng_state_all() if cuda else [],
            kernels=self.kernels,
            sharded=self.sharded,
        )

    def checkpoint(self) -> None:
        """Write the checkpoint of step ``done``: every rank its own shard, or rank 0 the
        gathered model."""
        model, optimizer = self.model, self.optimizer
        if self.sharded:  # every rank writes its own shard of the model and the optimizer
            self.rd.save_sharded_checkpoint(
                model, optimizer, self.tokenizer, self.run_dict, self._train_state({})
            )
            return
        # Gathering a sharded model or optimizer is collective: every rank takes part.
        saved, moments = saveable_model(model), optimizer_state(model, optimizer)
        if self.rank == 0:
            self.rd.save_checkpoint(
                saved, self.tokenizer, self.run_dict, self._train_state(moments)
            )

    def snapshot(self) -> None:
        """Write the weights of step ``done`` for averaging (gathering them is collective)."""
        snapshot = saveable_model(self.model)
        if self.rank == 0:
            self.rd.save_snapshot(self.done, snapshot, self.tokenizer, self.run_dict)

    def _result(self) -> FitResult:
        seconds = time.perf_counter() - self.t0
        return FitResult(
            self.done,
            self.tc.max_steps,
            self.val,
            self.history,
            self.rd.pointer,
            seconds,
            self.tokens_seen / seconds if seconds else 0.0,
            peak_rss_mib(),
            skipped_steps=self.skipped,
        )


def fit(
    model: TransformerModel,
    task: Task,
    run: RunConfig,
    rd: RunDir,
    *,
    tokenizer: Tokenizer,
    state: TrainState | None = None,
    stop_after: int | None = None,
    progress: bool = True,
) -> FitResult:
    """Train ``model`` from ``state`` (or from scratch) to ``run.train.max_steps``, or to step
    ``stop_after`` (a planned interruption, for tests and benchmarks): a ``Trainer``'s
    run, or at once the result of a resumed run that had already reached ``max_steps``."""
    start, history = (0, []) if state is None else (state.step, state.history)
    if start >= run.train.max_steps:
        return FitResult(
            start,
            run.train.max_steps,
            _last_val(history),
            history,
            rd.pointer,
            0.0,
            0.0,
            peak_rss_mib(),
            already_complete=True,
        )
    trainer = Trainer(
        model,
        task,
        run,
        rd,
        tokenizer=tokenizer,
        state=state,
        stop_after=stop_after,
        progress=progress,
    )
    return trainer.run()


# Set by each task from its data (the tokenizer's vocabulary, the images' size, the context
# a block needs), not taken from [model] as written: a resumed run does not compare them.
