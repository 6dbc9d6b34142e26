"""Learning-rate schedules, as multipliers of the step number (1-based).

* ``paper_schedule`` -- §5.3, Eq. (3):
  ``lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``: linear warm-up, then decay
  with the inverse square root of the step.
* ``cosine_schedule`` -- linear warm-up to ``lr``, then cosine decay to ``min_lr`` at
  ``total`` steps (Loshchilov & Hutter, 2017; the GPT-3 / nanoGPT recipe).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiayn.config.run import TrainConfig


def paper_schedule(step: int, *, d_model: int, warmup: int, factor: float = 1.0) -> float:
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def cosine_schedule(step: int, *, lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def lr_schedule(tc: TrainConfig, d_model: int) -> Callable[[int], float]:
    """Step (from 0) -> learning rate, as ``tc.schedule`` names it: "paper" (Eq. 3, with
    ``tc.lr`` as its factor) or "cosine" (warm-up to ``tc.lr``, decay to ``tc.min_lr``)."""
    if tc.schedule == "paper":
        return lambda step: paper_schedule(
            step + 1, d_model=d_model, warmup=tc.warmup_steps, factor=tc.lr
        )
    return lambda step: cosine_schedule(
        step, lr=tc.lr, min_lr=tc.min_lr, warmup=tc.warmup_steps, total=tc.max_steps
    )
