"""A trained table of position vectors added to the embeddings (GPT-2, BERT).  The paper
found it "nearly identical" to the sinusoids (§3.5, Table 3 row E)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.positions.base import PositionScheme, check_positions


class LearnedPositions(PositionScheme):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.weight = nn.Parameter(torch.zeros(config.max_len, config.d_model))

    def embed(self, positions: Tensor) -> Tensor:
        check_positions(positions, self.max_len)
        return self.weight[positions]  # (T, C) or (B, T, C)
