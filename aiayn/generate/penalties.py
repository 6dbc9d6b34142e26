"""OpenAI's penalties and logit bias: what a client adds to the logits before sampling.

For a token ``t`` that the reply so far holds ``c[t]`` times::

    logits[t] -= presence_penalty * (c[t] > 0) + frequency_penalty * c[t]
    logits[t] += logit_bias[t]

as OpenAI documents them (and vLLM applies them, to the generated tokens only).  They change
what is sampled; the log-probabilities a server reports are the model's own, before them.
Shapes: V vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True)
class Penalties:
    """``presence`` and ``frequency`` in [-2, 2]; ``bias`` maps token ids to [-100, 100]."""

    presence: float = 0.0
    frequency: float = 0.0
    bias: Mapping[int, float] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.presence or self.frequency or self.bias)

    def bias_vector(self, vocab: int, device: torch.device) -> Tensor | None:
        """(V,) the bias as a vector, or None without one."""
        if not self.bias:
            return None
        out = torch.zeros(vocab, device=device)
        ids = torch.tensor(list(self.bias), device=device)
        out[ids] = torch.tensor(list(self.bias.values()), device=device)
        return out

    def apply(self, logits: Tensor, counts: Tensor, bias: Tensor | None) -> Tensor:
        """(1, V) float logits with the penalties for ``counts`` (1, V) and ``bias`` (V,)."""
        if self.presence or self.frequency:
            logits = logits - self.presence * (counts > 0) - self.frequency * counts
        return logits if bias is None else logits + bias
