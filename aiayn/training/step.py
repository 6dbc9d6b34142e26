"""One optimizer step: learning rate, micro-batches, loss, backward, clipping, update.

Gradient accumulation averages ``grad_accum`` micro-batches; with several processes each rank
takes its share of the step's micro-batches and DistributedDataParallel averages the ranks'
gradients, so the update is the same as one process accumulating them all.  A mixture of
experts adds its load-balancing loss.  A loss or gradient norm that is not finite leaves the
weights and optimizer untouched: the step is reported as such, and the loop stops or skips
it as ``train.on_nonfinite`` says.

Batches come from the task on the CPU and are moved to the model's device here (from pinned
memory, without blocking, on a GPU).  In float16 a gradient scaler multiplies the loss before
the backward pass and skips an update whose scaled gradients overflowed -- that is the
scaler's normal working, not a failure.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from aiayn.config.run import TrainConfig
from aiayn.nn.context import Record
from aiayn.training.task import Task


@dataclass(frozen=True)
class StepOutcome:
    loss: float  # mean over the step's micro-batches (and ranks)
    lr: float
    tokens: int  # target tokens of the step, over all ranks
    finite: bool  # False: the update was not applied


class TrainStep:
    def __init__(
        self,
        model: torch.nn.Module,
        wrapped: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Callable[[int], float],
        task: Task,
        tc: TrainConfig,
        *,
        rank: int,
        world: int,
        autocast: contextlib.AbstractContextManager[object],
        device: torch.device,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.model, self.wrapped, self.optimizer = model, wrapped, optimizer
        self.schedule, self.task, self.tc = schedule, task, tc
        self.rank, self.world, self.autocast = rank, world, autocast
        self.device, self.scaler = device, scaler

    def _to_device(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            if self.device.type == "cpu":
                return batch
            return batch.pin_memory().to(self.device, non_blocking=True)
        if isinstance(batch, tuple | list):
            return type(batch)(self._to_device(b) for b in batch)
        return batch

    def __call__(self, step: int) -> StepOutcome:
        """Step ``step`` (from 0): draws its batches, and updates the model if all is finite."""
        tc = self.tc
        lr = self.schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total, tokens = 0.0, 0
        batches = self.task.next_batches(tc.grad_accum, self.rank, self.world)
        for batch in batches:
            record = Record()
            with self.autocast:
                loss, n_tokens = self.task.loss(self.wrapped, self._to_device(batch), record)
            objective = loss
            if record.router:  # mixture of experts: the load-balancing loss, mean over layers
                balance = torch.stack([s.aux_loss for s in record.router]).mean()
                objective = loss + tc.moe_aux_weight * balance
            objective = objective / len(batches)
            (objective if self.scaler is None else self.scaler.scale(objective)).backward()
            total += loss.item() / len(batches)
            tokens += n_tokens * self.world
        if self.world > 1:  # the global batch's loss, not this rank's share
            reduced = torch.tensor([total], device=self.device)
            dist.all_reduce(reduced)
            total = reduced.item() / self.world
        if self.scaler is not None:
            finite = math.isfinite(total)
            if finite:
                self.scaler.unscale_(self.optimizer)
                if self.tc.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.grad_clip)
                self.scaler.step(self.optimizer)  # skipped by the scaler if a gradient overflowed
            self.scaler.update()
        else:
            norm = math.inf if not math.isfinite(total) else self._clip()
            finite = math.isfinite(total) and math.isfinite(norm)
            if finite:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(total, lr, tokens, finite)

    def _clip(self) -> float:
        """Clip the gradient norm (if configured) and return it (0 when not measured)."""
        if self.tc.grad_clip is None:
            finite = all(
                bool(torch.isfinite(p.grad).all())
                for p in self.model.parameters()
                if p.grad is not None
            )
            return 0.0 if finite else math.inf
        return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.tc.grad_clip))
