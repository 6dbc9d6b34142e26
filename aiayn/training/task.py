"""What the training loop asks of a task: batches, their loss, a validation loss, and the
data position that a checkpoint must save.  The loop knows nothing else about the model."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from aiayn.models import TransformerModel
from aiayn.nn.context import Record


class Task(Protocol):
    @property
    def linear_rows(self) -> int | None:
        """Rows of a micro-batch's activations (B × T) the linear layers see: a language
        model's fixed windows, or the token budget of token-count batches; None when the shapes
        are unknown.  The loop times oneDNN against MKL at this row count and keeps the faster
        on this host (aiayn/nn/cpu_kernels.py).  oneDNN builds a kernel per row count; rows are
        padded to a multiple of ``ROW_MULTIPLE``, so batches of up to N tokens meet at most
        N / 64 of them."""
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
