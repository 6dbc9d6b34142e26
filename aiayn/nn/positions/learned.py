"""A trained table of position vectors added to the embeddings (GPT-2, BERT).  The paper
found it "nearly identical" to the sinusoids (§3.5, Table 3 row E)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.config import PositionConfig
from aiayn.nn.positions.base import PositionScheme, PositionSizes, check_positions


class LearnedPositions(PositionScheme):
    def __init__(self, positions: PositionConfig, sizes: PositionSizes) -> None:
        super().__init__(positions, sizes)
        self.weight = nn.Parameter(torch.zeros(sizes.max_len, sizes.d_model))

    def embed(self, positions: Tensor) -> Tensor:
        check_positions(positions, self.max_len)
        return self.weight[positions]  # (T, C) or (B, T, C)
