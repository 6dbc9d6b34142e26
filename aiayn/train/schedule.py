"""Learning-rate schedules, as multipliers of the step number (1-based).

* :func:`paper_schedule` -- §5.3, Eq. (3):
  ``lrate = d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)``: linear warm-up, then decay
  with the inverse square root of the step.
* :func:`cosine_schedule` -- linear warm-up to ``lr``, then cosine decay to ``min_lr`` at
  ``total`` steps (Loshchilov & Hutter, 2017; the GPT-3 / nanoGPT recipe).
"""

from __future__ import annotations

import math


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
