"""Input embeddings (§3.4) plus positions (§3.5), then dropout (§5.4).

``Embed(x) = E[x] · sqrt(d_model) + PE(pos)``: the paper multiplies the embedding weights by
sqrt(d_model), so that the embeddings (drawn with std d_model^-0.5) and the unit-scale
sinusoids have comparable magnitude.  The same matrix E can be shared with the other
embedding and the pre-softmax projection ("weight tying", §3.4; Press & Wolf, 2017).

Rotary positions and ALiBi add nothing here: they act inside attention.

Shapes: B batch, T positions, C = d_model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.nn.norms import build_norm
from aiayn.nn.positions import build_positions


class Embeddings(nn.Module):
    """Token embeddings (scaled), plus what the position scheme adds and (BERT) a token-type
    embedding, then (BERT) a norm, then dropout.

    ``self.positions`` is the model's position scheme (aiayn/nn/positions/); schemes that act
    inside attention (rotary, ALiBi) add nothing here and give the model their state.
    """

    def __init__(
        self, config: ModelConfig, vocab_size: int, *, token: nn.Embedding | None = None
    ) -> None:
        super().__init__()
        d = config.d_model
        self.token = nn.Embedding(vocab_size, d) if token is None else token
        self.vocab_size = vocab_size
        self.scale = math.sqrt(d) if config.scale_embeddings else 1.0
        self.positions = build_positions(config)
        types = config.type_vocab_size
        self.token_type = nn.Embedding(types, d) if types else None
        self.norm = (
            build_norm(config.norm, d, config.norm_eps, config.bias)
            if config.embedding_norm
            else None
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, ids: Tensor, positions: Tensor, token_types: Tensor | None = None) -> Tensor:
        """(B, T) token ids (checked by the model), (T,) or (B, T) positions, and (B, T)
        token types (None: type 0 everywhere, as BERT takes it) -> (B, T, C)."""
        x = self.token(ids)  # (B, T, C)
        if self.scale != 1.0:
            x = x * self.scale
        if self.token_type is not None:
            x = x + (
                self.token_type.weight[0] if token_types is None else self.token_type(token_types)
            )
        elif token_types is not None:
            raise UserError(
                "token_type_ids given, but the model has no token types (type_vocab_size=0)"
            )
        added = self.positions.embed(positions)
        if added is not None:
            x = x + added
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


def check_token_mask(mask: Tensor, ids: Tensor, name: str = "attention_mask") -> None:
    """A per-token mask must be bool and shaped like the ids it describes."""
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool or mask.shape != ids.shape:
        got = (
            f"{mask.dtype} {tuple(mask.shape)}" if isinstance(mask, Tensor) else type(mask).__name__
        )
        raise UserError(
            f"{name} must be bool with the shape of the ids {tuple(ids.shape)}, got {got}"
        )


def check_ids(ids: Tensor, vocab_size: int, name: str = "ids") -> None:
    """Token ids must be an integer (B, T) tensor inside the vocabulary."""
    if not isinstance(ids, Tensor):
        raise UserError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise UserError(f"{name} must be an integer tensor of token ids, got dtype {ids.dtype}")
    if ids.dim() != 2:
        raise UserError(f"{name} must have shape (batch, length), got {tuple(ids.shape)}")
    if not ids.numel() or torch.compiler.is_compiling():
        return  # a captured decoding step feeds the model's own choices: nothing to sync on
    low, high = (int(v) for v in torch.aminmax(ids))  # one pass, one sync
    if low < 0 or high >= vocab_size:
        raise UserError(f"{name} must lie in [0, {vocab_size}), got values in [{low}, {high}]")
