"""Encoder-only model (BERT: Devlin et al., 2019) with a masked-language-model head.

The paper's encoder on its own: every position sees every other real position, so the model
is trained by hiding tokens and predicting them.  The head follows BERT: a dense layer, the
activation, a norm, then the (tied) projection to the vocabulary with its own bias.

Shapes: B batch, T positions, C = d_model, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.models.base import Stack, TransformerModel, head_cross_entropy
from aiayn.nn.context import Record
from aiayn.nn.embedding import Embeddings, check_ids, check_token_mask
from aiayn.nn.linear import Linear
from aiayn.nn.loss import linear_cross_entropy
from aiayn.nn.norms import build_norm


class MaskedLMHead(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.dense = Linear(c.d_model, c.d_model)
        self.norm = build_norm(c.norm, c.d_model, c.norm_eps)
        self.proj = Linear(c.d_model, c.vocab_size, bias=True)
        self.tanh_gelu = c.ffn.activation == "gelu_tanh"

    def transform(self, x: Tensor) -> Tensor:
        """(B, T, C) -> (B, T, C): everything before the projection to the vocabulary."""
        h = F.gelu(self.dense(x), approximate="tanh" if self.tanh_gelu else "none")  # (B, T, C)
        return self.norm(h)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.transform(x))  # (B, T, V)


class EncoderLM(TransformerModel):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.arch != "encoder":
            raise UserError(f"EncoderLM needs arch='encoder', got {config.arch!r}")
        c = config
        self.embed = Embeddings(c, c.vocab_size)
        self.encoder = Stack(c, c.n_layers, stream="encoder")
        self.head = MaskedLMHead(c) if c.mlm_head else None
        self.pooler = Linear(c.d_model, c.d_model) if c.pooler else None  # BERT: dense + tanh
        self.init_weights()
        if c.tie_embeddings and self.head is not None:
            self.head.proj.weight = self.embed.token.weight

    def encode(
        self,
        ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        record: Record | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """(B, T) ids (and BERT's (B, T) token types) -> (B, T, C) contextual vectors."""
        check_ids(ids, self.config.vocab_size)
        if token_type_ids is not None:
            if token_type_ids.shape != ids.shape:
                raise UserError(
                    f"token_type_ids of shape {tuple(token_type_ids.shape)} must match the ids'"
                    f" {tuple(ids.shape)}"
                )
            check_ids(token_type_ids, max(1, self.config.type_vocab_size), "token_type_ids")
        if attention_mask is None and self.config.pad_id is not None:
            keep = ids != self.config.pad_id
            attention_mask = None if bool(keep.all()) else keep
        elif attention_mask is not None:
            check_token_mask(attention_mask, ids)
        x, ctx = self.embed_context(
            self.embed,
            ids,
            attention_mask,
            None,
            causal=False,
            record=record,
            token_types=token_type_ids,
        )
        return self.encoder(x, ctx)

    def pool(self, hidden: Tensor) -> Tensor:
        """BERT's pooled output: tanh(W h_[CLS] + b) of the (B, T, C) encoding -> (B, C)."""
        if self.pooler is None:
            raise UserError("this encoder has no pooler (config pooler=False)")
        return torch.tanh(self.pooler(hidden[:, 0]))

    def forward(
        self,
        ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        record: Record | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """(B, T) ids -> (B, T, V) logits for the masked-token prediction.

        With ``targets`` (B, T) -- the original token where one was masked, -100 elsewhere --
        the mean cross entropy over the masked positions instead, without the logits.
        """
        if self.head is None:
            raise UserError("this encoder has no masked-LM head (mlm_head=False): use encode()")
        x = self.encode(
            ids, attention_mask=attention_mask, record=record, token_type_ids=token_type_ids
        )  # (B, T, C)
        if targets is None:
            return self.head(x)
        if not isinstance(self.head.proj, nn.Linear):  # int8 weights: evaluation only
            return head_cross_entropy(self.head, x, targets, label_smoothing)
        return linear_cross_entropy(
            self.head.transform(x),
            self.head.proj.weight,
            targets,
            bias=self.head.proj.bias,
            label_smoothing=label_smoothing,
        )

    def forward_with_weights(
        self, ids: Tensor, *, attention_mask: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        record = Record(weights=True)
        logits = self(ids, attention_mask=attention_mask, record=record)
        return logits, [a.weights for a in record.attention if a.weights is not None]
