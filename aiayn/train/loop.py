"""The training loop, shared by every task; it knows nothing about what the model is.

A :class:`Task` supplies batches, the loss of a batch, a validation loss, and its data
position (saved in checkpoints).  The loop does the rest: learning-rate schedule, gradient
accumulation, clipping, optional bf16 autocast and ``torch.compile``, validation at intervals,
a progress bar (loss, validation loss, learning rate, tokens/s, ETA), a CSV log, and atomic,
resumable checkpoints -- a run killed at any moment and resumed continues with the same
batches, dropout masks and learning rates as one that never stopped.

Several processes: launched by ``torchrun``, the loop wraps the model in
DistributedDataParallel (gloo on CPU, nccl on GPU).  Every step draws ``world × grad_accum``
micro-batches from the same data order on every rank, and rank r takes its share, so two
processes with ``grad_accum = a`` compute exactly the step that one process computes with
``grad_accum = 2a``: DDP averages the ranks' gradients as accumulation averages micro-batches.
Only rank 0 writes logs and checkpoints.
"""

from __future__ import annotations

import csv
import math
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from tqdm import tqdm

from aiayn.data.tokenizer import Tokenizer
from aiayn.models import TransformerModel
from aiayn.nn.moe import RouterStats
from aiayn.train.config import RunConfig, TrainConfig
from aiayn.train.optim import build_adamw
from aiayn.train.schedule import lr_schedule
from aiayn.train.state import TrainState, load_checkpoint, save_checkpoint, save_snapshot

CHECKPOINT = "checkpoint"  # the latest resumable checkpoint, inside the run folder
SNAPSHOTS = "snapshots"  # model-only snapshots kept for checkpoint averaging


class Task(Protocol):
    def next_batches(self, n: int, rank: int, world: int) -> list[Any]:
        """This rank's ``n`` micro-batches of the next step (advances the data position)."""
        ...

    def loss(
        self, model: torch.nn.Module, batch: Any, aux: list[RouterStats]
    ) -> tuple[torch.Tensor, int]:
        """Mean loss over the batch's target tokens, and how many tokens it covered."""
        ...

    def evaluate(self, model: TransformerModel) -> float:
        """Validation loss in nats per target token."""
        ...

    def data_state(self) -> dict[str, Any]: ...

    def load_data_state(self, state: dict[str, Any]) -> None: ...


def prepare_run(
    tc: TrainConfig, out_dir: str | Path, resume: bool
) -> tuple[Path, tuple[TransformerModel, Tokenizer, TrainState] | None]:
    """Create the run folder and set threads; with ``resume`` and a checkpoint there, return
    its model, tokenizer and training state to continue from."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tc.threads:
        torch.set_num_threads(tc.threads)
    ckpt = out / CHECKPOINT
    if not (resume and ckpt.exists()):
        return out, None
    model, tokenizer, _, state = load_checkpoint(ckpt)
    if state is None:
        raise ValueError(f"{ckpt} holds a model but no training state to resume")
    return out, (model, tokenizer, state)


def world_info() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def fit(
    model: TransformerModel,
    task: Task,
    run: RunConfig,
    out: Path,
    *,
    tokenizer: Tokenizer,
    state: TrainState | None = None,
    stop_after: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    tc = run.train
    run_dict = run.to_dict() | {"model": model.config.to_dict()}
    optimizer = build_adamw(
        model, lr=tc.lr, weight_decay=tc.weight_decay, betas=(tc.beta1, tc.beta2), eps=tc.adam_eps
    )
    schedule = lr_schedule(tc, model.config.d_model)
    rank, world = world_info()
    start, history = 0, []
    if state is not None:
        optimizer.load_state_dict(state.optimizer)
        torch.set_rng_state(state.torch_rng)
        task.load_data_state(state.data)
        start, history = state.step, state.history
    model.train()
    wrapped: torch.nn.Module = model
    if world > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    if tc.compile:
        wrapped = torch.compile(wrapped)  # type: ignore[assignment]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=tc.dtype == "bfloat16")
    ckpt = out / CHECKPOINT
    writer_file = open(out / "log.csv", "a", newline="") if rank == 0 else None  # noqa: SIM115
    writer = csv.writer(writer_file) if writer_file is not None else None
    if writer is not None and (out / "log.csv").stat().st_size == 0:
        writer.writerow(["step", "loss", "lr", "val_loss", "tokens_per_s", "val_ppl"])

    def checkpoint(step: int) -> None:
        if rank != 0:
            return
        save_checkpoint(
            ckpt,
            model,
            tokenizer,
            run_dict,
            TrainState(
                step, optimizer.state_dict(), torch.get_rng_state(), task.data_state(), history
            ),
        )
        if tc.keep_snapshots > 0:
            save_snapshot(out / SNAPSHOTS / f"step_{step:08d}", model, tokenizer, run_dict)
            snaps = sorted((out / SNAPSHOTS).glob("step_*"))
            for old in snaps[: -tc.keep_snapshots]:
                shutil.rmtree(old, ignore_errors=True)

    end = tc.max_steps if stop_after is None else min(tc.max_steps, stop_after)
    bar = tqdm(
        range(start, end),
        initial=start,
        total=tc.max_steps,
        disable=not progress or rank != 0,
        dynamic_ncols=True,
    )
    t0, tokens_seen, val = time.perf_counter(), 0, float("nan")
    try:
        for step in bar:
            lr = schedule(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            total = 0.0
            batches = task.next_batches(tc.grad_accum, rank, world)
            for batch in batches:
                aux: list[RouterStats] = []
                with autocast:
                    loss, n_tokens = task.loss(wrapped, batch, aux)
                objective = loss
                if aux:  # mixture of experts: add the load-balancing loss (mean over layers)
                    objective = (
                        loss + tc.moe_aux_weight * torch.stack([s.aux_loss for s in aux]).mean()
                    )
                (objective / len(batches)).backward()
                total += loss.item() / len(batches)
                tokens_seen += n_tokens * world
            if world > 1:  # log the global batch's loss, not this rank's share
                reduced = torch.tensor([total])
                dist.all_reduce(reduced)
                total = reduced.item() / world
            if not math.isfinite(total):
                raise FloatingPointError(
                    f"loss became {total} at step {step + 1}; lower the learning rate"
                )
            if tc.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done = step + 1
            speed = tokens_seen / (time.perf_counter() - t0)
            record: dict[str, float] = {"step": done, "loss": total, "lr": lr}
            if done % tc.eval_interval == 0 or done == tc.max_steps:
                val = task.evaluate(model)
                record["val_loss"] = val
                record["val_ppl"] = math.exp(min(val, 50.0))  # perplexity
            history.append(record)
            if writer is not None:
                writer.writerow(
                    [
                        done,
                        f"{total:.5f}",
                        f"{lr:.3e}",
                        f"{record.get('val_loss', '')}",
                        f"{speed:.0f}",
                        f"{record.get('val_ppl', '')}",
                    ]
                )
            bar.set_postfix(
                loss=f"{total:.3f}",
                val=f"{val:.3f}",
                ppl=f"{math.exp(min(val, 50.0)):.2f}" if math.isfinite(val) else "nan",
                lr=f"{lr:.1e}",
                tok_s=f"{speed:,.0f}",
            )
            out_of_time = (
                tc.max_minutes is not None and time.perf_counter() - t0 > 60 * tc.max_minutes
            )
            if tc.max_minutes is not None and world > 1:  # every rank must stop at the same step
                flag = torch.tensor([float(out_of_time)])
                dist.all_reduce(flag, op=dist.ReduceOp.MAX)
                out_of_time = bool(flag.item())
            if done % tc.checkpoint_interval == 0 or done == end or out_of_time:
                checkpoint(done)
            if out_of_time:
                break
    finally:
        if writer_file is not None:
            writer_file.close()
        bar.close()
    seconds = time.perf_counter() - t0
    return {
        "history": history,
        "val_loss": val,
        "checkpoint": str(ckpt),
        "seconds": seconds,
        "tokens_per_s": tokens_seen / seconds if seconds else 0.0,
    }
