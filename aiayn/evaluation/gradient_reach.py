"""How far back a trained model's gradient reaches: the measured counterpart of "0.9^k".

A recurrent decoder passes a token's influence on to the next one through its state, step by
step; the gradient of a late prediction with respect to an early input goes back through
every step between them and, the seeds say, shrinks like 0.9^k.  Attention reaches any
earlier position in one step.

``gradient_by_distance`` measures it on a trained encoder-decoder (the Transformer or an
RNN baseline of aiayn/models/rnn.py): for each sentence, the cross entropy of the prediction
at its last target position t, differentiated with respect to the decoder's input vectors;
the norm of that gradient at position t - k, averaged over the sentences long enough to
have one, for k = 0, 1, 2, ...  (The decoder's input vectors are what its first layer reads:
the token embedding, and for the Transformer the positional encoding added to it.)

Shapes: B sentences, S source length, T target length, C = d_model.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.errors import UserError
from aiayn.models import EncoderDecoder


def _decoder_input_module(model: EncoderDecoder) -> nn.Module:
    """The module whose output the decoder reads first (its last call in a forward pass --
    the encoder's lookup comes first, and may be the same module when embeddings are tied)."""
    module = getattr(model, "tgt_embed", None) or getattr(model, "tgt_token", None)
    if not isinstance(module, nn.Module):
        raise UserError(f"{type(model).__name__} has no target embedding to measure from")
    return module


def gradient_by_distance(
    model: EncoderDecoder,
    batches: Iterable[tuple[Tensor, Tensor, Tensor]],
    *,
    pad_id: int,
    max_distance: int = 40,
) -> tuple[list[float], list[int]]:
    """Mean gradient norm of the last prediction's loss with respect to the decoder input k
    positions back, for k = 0 .. ``max_distance``, over (source, decoder input, target)
    batches; and how many sentences each mean is over.  Dropout is off (``model.eval()``)."""
    model.eval()
    sums = torch.zeros(max_distance + 1, dtype=torch.float64)
    counts = torch.zeros(max_distance + 1, dtype=torch.long)
    captured: list[Tensor] = []

    def keep(_: nn.Module, __: object, output: Tensor) -> None:
        if output.requires_grad:
            output.retain_grad()
        captured.append(output)

    handle = _decoder_input_module(model).register_forward_hook(keep)
    # cuDNN's RNN backward refuses evaluation mode; the native kernels compute the same thing.
    no_cudnn = torch.backends.cudnn.flags(enabled=False)
    try:
        no_cudnn.__enter__()
        for src, tgt_in, tgt_out in batches:
            captured.clear()
            model.zero_grad(set_to_none=True)
            logits = model(src, tgt_in)  # (B, T, V)
            inputs = captured[-1]  # (B, T, C): the decoder's call
            last = (tgt_out != pad_id).sum(-1) - 1  # (B,) the last real target position
            rows = torch.arange(src.shape[0])
            # One loss per sentence, summed: each sentence's gradient stays in its own row.
            F.cross_entropy(logits[rows, last], tgt_out[rows, last], reduction="sum").backward()
            assert inputs.grad is not None
            norms = inputs.grad.norm(dim=-1).double()  # (B, T)
            for b in range(src.shape[0]):
                t = int(last[b])
                k = min(t, max_distance)
                # position t - j for j = 0 .. k
                sums[: k + 1] += norms[b, t - k : t + 1].flip(0)
                counts[: k + 1] += 1
    finally:
        no_cudnn.__exit__(None, None, None)
        handle.remove()
        model.zero_grad(set_to_none=True)
    means = torch.where(counts > 0, sums / counts.clamp(min=1), torch.nan)
    return means.tolist(), counts.tolist()
