"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty.

Each transformation is a small pure function on (B, V) logits, applied in this order:

1. repetition penalty (Keskar et al., 2019, CTRL): tokens already in the sequence have their
   logit divided by ``penalty`` if positive, multiplied if negative;
2. temperature: logits / T (T -> 0 is greedy, T = 1 the model's own distribution);
3. top-k (Fan et al., 2018): keep the k most likely tokens;
4. top-p, nucleus (Holtzman et al., 2020): keep the smallest set of most likely tokens whose
   probability mass reaches p.

Shapes: B batch, V vocabulary, S tokens so far.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.errors import UserError

_FP32_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class SamplingConfig:
    """``temperature=0`` means greedy decoding; the filters then make no difference."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise UserError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k is not None and self.top_k < 1:
            raise UserError(f"top_k={self.top_k} must be a positive integer or None")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p={self.top_p} must be in (0, 1] or None")
        if self.repetition_penalty <= 0:
            raise UserError(f"repetition_penalty={self.repetition_penalty} must be > 0")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or one too small for fp32 to hold (below its smallest normal number,
        1.2e-38: dividing by it gives 0/0 at the argmax), whose distribution is the argmax's
        anyway."""
        return self.temperature < _FP32_TINY


def apply_repetition_penalty(logits: Tensor, seen: Tensor, penalty: float) -> Tensor:
    """(B, V) logits; ``seen`` (B, V) bool marks tokens present so far."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep the k largest logits of each row (and ties with the k-th); the rest become -inf."""
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose total probability is >= p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
    drop_sorted = mass_before >= p  # once p is reached, the rest are dropped
    # The most likely token always stays: a p below fp32's smallest number (5e-324) rounds to
    # 0 in the comparison, which would drop every token and leave nothing to sample from.
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def _penalised(logits: Tensor, config: SamplingConfig, seen: Tensor | None) -> Tensor:
    logits = logits.float()
    if seen is None:
        return logits
    return apply_repetition_penalty(logits, seen, config.repetition_penalty)


def next_token_distribution(
    logits: Tensor, config: SamplingConfig, *, seen: Tensor | None = None
) -> Tensor:
    """(B, V) logits -> (B, V) probabilities the sampler draws from, after the repetition
    penalty, temperature, top-k and top-p.  Greedy (temperature 0) puts all mass on the argmax."""
    logits = _penalised(logits, config, seen)
    if config.greedy:
        return torch.zeros_like(logits).scatter(-1, logits.argmax(-1, keepdim=True), 1.0)
    # The max first: (l - max) / T is <= 0 everywhere, so a tiny T sends the others to -inf
    # (weight 0) instead of overflowing the largest to inf (inf - inf is NaN in the softmax).
    logits = (logits - logits.amax(-1, keepdim=True)) / config.temperature
    if config.top_k is not None:
        logits = top_k_filter(logits, config.top_k)
    if config.top_p is not None:
        logits = top_p_filter(logits, config.top_p)
    return logits.softmax(-1)


def choose_next(
    logits: Tensor,
    config: SamplingConfig,
    *,
    seen: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """(B, V) logits -> (B,) next token ids."""
    if config.greedy:
        return _penalised(logits, config, seen).argmax(-1)
    probs = next_token_distribution(logits, config, seen=seen)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
