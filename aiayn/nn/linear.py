"""The linear layer every projection of the model uses: ``y = x W^T + b``.

A plain ``torch.nn.Linear`` (same parameters, same ``state_dict``), named so that the model's
projections can be told apart from other modules.  Faster CPU products for training or
decoding are not chosen here: a caller hands the model to aiayn/nn/cpu_kernels.py for a
block of work, which swaps in a subclass of this layer for that block and measures nothing
inside ``forward``.

Shapes: ``(..., I)`` in, ``(..., O)`` out, for I in features and O out features.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class Linear(nn.Linear):
    """``y = x W^T + b``, the position-wise projection of Vaswani et al. (2017), §3.2-3.3."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)  # (..., I) -> (..., O)
