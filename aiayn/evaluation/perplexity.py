"""How well a model predicts held-out text: cross entropy in nats per token, and perplexity.

* ``evaluate_lm`` -- a language model on fixed random windows of a token stream's
  validation split (perplexity, and bits per character for a character model).
* ``translation_loss`` -- a translation model's cross entropy of the reference targets,
  without label smoothing, over token-count batches of a validation set.

Both are what training reports as validation loss, and what ``aiayn evaluate`` prints.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from aiayn.data.lm_data import TokenStream
from aiayn.errors import UserError
from aiayn.models import DecoderLM, EncoderDecoder
from aiayn.nn.context import Record


def lm_loss(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, record: Record | None = None
) -> torch.Tensor:
    """Next-token cross entropy (nats per token); MoE router statistics go to ``record``."""
    loss: torch.Tensor = model(x, record=record, targets=y)
    return loss


@torch.no_grad()
def evaluate_lm(
    model: DecoderLM,
    stream: TokenStream,
    *,
    batches: int,
    batch_size: int,
    block: int,
    seed: int = 0,
) -> float:
    """Mean validation loss (nats per token) over fixed random windows."""
    if batches < 1:
        raise UserError(f"batches={batches}: evaluate at least 1 batch")
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    losses = []
    for _ in range(batches):
        x, y = stream.batch("val", batch_size, block, g)
        losses.append(lm_loss(model, x.to(device), y.to(device)).item())
    model.train(was)
    return sum(losses) / len(losses)


@torch.no_grad()
def translation_loss(
    model: EncoderDecoder,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    pad_id: int,
) -> float:
    """Cross entropy (no smoothing) in nats per target token over (source, decoder input,
    decoder target) batches; NaN when there are no target tokens."""
    was = model.training
    model.eval()
    total, tokens = 0.0, 0
    device = next(model.parameters()).device
    for src, tgt_in, tgt_out in batches:
        n = int((tgt_out != pad_id).sum())
        loss = model(src.to(device), tgt_in.to(device), targets=tgt_out.to(device))
        total += float(loss) * n
        tokens += n
    model.train(was)
    return total / tokens if tokens else float("nan")
