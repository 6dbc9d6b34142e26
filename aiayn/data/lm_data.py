"""Language-model data: one long token stream, split by position, sampled as random windows.

As in nanoGPT: the first ``train_fraction`` of the text trains, the rest validates; a batch
is B windows of T+1 consecutive tokens starting at random offsets, input = window[:-1],
target = window[1:].  The offsets come from a ``torch.Generator`` owned by the stream, whose
state is saved in checkpoints, so a resumed run sees the same batches.

Shapes: B batch, T block (context) length.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from aiayn.data.files import read_text
from aiayn.data.shards import Mapped
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import UserError


class TokenStream:
    """A token stream split into training and validation by position: in memory (numpy or
    torch), or mapped from shards (``mapped``, whose touched pages it hands back as it
    reads)."""

    def __init__(
        self,
        tokens: np.ndarray | Tensor,
        *,
        train_fraction: float = 0.9,
        seed: int = 0,
        mapped: Mapped | None = None,
    ) -> None:
        if not 0.0 < train_fraction < 1.0:
            raise UserError(f"train_fraction={train_fraction} must be in (0, 1)")
        data = tokens.numpy() if isinstance(tokens, Tensor) else tokens
        n = int(len(data) * train_fraction)
        self.splits = {"train": data[:n], "val": data[n:]}
        self.generator = torch.Generator().manual_seed(seed)
        self.mapped = mapped

    @classmethod
    def from_text(cls, text: str, tokenizer: Tokenizer, **kw: float | int) -> TokenStream:
        return cls(np.asarray(tokenizer.encode(text), dtype=np.int64), **kw)  # type: ignore[arg-type]

    @classmethod
    def from_file(cls, path: str | Path, tokenizer: Tokenizer, **kw: float | int) -> TokenStream:
        return cls.from_text(read_text(path), tokenizer, **kw)

    def require(self, block: int) -> None:
        """Raise ValueError unless both splits hold a window of ``block`` + 1 tokens: checked
        when a run starts, not at its first evaluation ``eval_interval`` steps later."""
        for split in self.splits:
            self._check(split, block)

    def _check(self, split: str, block: int) -> None:
        n = len(self.splits[split])
        if n <= block + 1:
            raise UserError(
                f"the {split} split has {n} tokens; block={block} needs at least {block + 2}"
                " (a longer text, a smaller block, or another train_fraction)"
            )

    def batch(
        self, split: str, batch_size: int, block: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """(B, T) inputs and (B, T) next-token targets from random offsets in ``split``."""
        self._check(split, block)
        data = self.splits[split]
        g = self.generator if generator is None else generator
        starts = torch.randint(len(data) - block - 1, (batch_size,), generator=g)  # (B,)
        offsets = starts[:, None] + torch.arange(block + 1)  # (B, T+1)
        window = torch.from_numpy(data[offsets.numpy()].astype(np.int64))
        if self.mapped is not None:
            self.mapped.note_read(batch_size)
        return window[:, :-1], window[:, 1:]
