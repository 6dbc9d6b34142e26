"""What the training loop asks of a task: batches, their loss, a validation loss, and the
data position that a checkpoint must save.  The loop knows nothing else about the model."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from aiayn.models import TransformerModel
from aiayn.nn.context import Record


class Task(Protocol):
    @property
    def fixed_rows(self) -> int | None:
        """Rows of a micro-batch's activations (B × T) when every batch has the same shape --
        a language model's windows -- else None.  With fixed shapes the loop lets the linear
        layers use oneDNN where it measures faster on this host (its kernels are built per
        shape, so varying shapes would pile them up: aiayn/nn/linear.py)."""
        ...

    def next_batches(self, n: int, rank: int, world: int) -> list[Any]:
        """This rank's ``n`` micro-batches of the next step (advances the data position)."""
        ...

    def loss(self, model: torch.nn.Module, batch: Any, record: Record) -> tuple[torch.Tensor, int]:
        """Mean loss over the batch's target tokens, and how many tokens it covered; the
        forward pass records into ``record`` (router statistics of a mixture of experts)."""
        ...

    def evaluate(self, model: TransformerModel) -> float:
        """Validation loss in nats per target token."""
        ...

    def data_state(self) -> dict[str, Any]: ...

    def load_data_state(self, state: dict[str, Any]) -> None: ...
