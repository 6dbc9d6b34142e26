"""Decoder-only language model (GPT: Radford et al., 2018/2019; Llama: Touvron et al., 2023).

The paper's decoder without cross-attention: a stack of causally masked blocks predicting the
next token, ``p(x_{t+1} | x_{<=t})`` for every t in one pass.

Left padding (batched prompts of different lengths) is handled by an explicit
``attention_mask`` (B, T) -- True at real tokens.  Positions then count real tokens only, so a
left-padded prompt sees exactly the positions it would see alone; the padded keys are hidden
from every query.  With a :class:`~aiayn.nn.cache.Cache` the model appends to it and the new
tokens continue at the cached length.

Shapes: B batch, T new positions, S all positions (cached + new), C = d_model, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.models.base import Stack, TransformerModel
from aiayn.nn.blocks import Weights
from aiayn.nn.cache import Cache
from aiayn.nn.embedding import Embeddings, check_ids, check_token_mask
from aiayn.nn.linear import Linear
from aiayn.nn.masks import key_padding_to_attention
from aiayn.nn.moe import RouterStats


class DecoderLM(TransformerModel):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.arch != "decoder":
            raise ValueError(f"DecoderLM needs arch='decoder', got {config.arch!r}")
        c = config
        self.embed = Embeddings(
            c.vocab_size,
            c.d_model,
            positional=c.positional,
            max_len=c.max_len,
            scale=c.scale_embeddings,
            dropout=c.dropout,
        )
        self.decoder = Stack(c, c.n_layers)
        self.head = Linear(c.d_model, c.vocab_size, bias=False)
        self.init_weights()
        if c.tie_embeddings:
            self.head.weight = self.embed.token.weight

    def new_cache(
        self, batch: int, capacity: int | None = None, *, dtype: torch.dtype | None = None
    ) -> Cache:
        """An empty KV cache for ``batch`` sequences of up to ``capacity`` (max_len) tokens."""
        c = self.config
        capacity = c.max_len if capacity is None else capacity
        if capacity > c.max_len:
            raise ValueError(f"cache capacity {capacity} exceeds the model's max_len={c.max_len}")
        p = self.head.weight
        return Cache.empty(
            c.n_layers,
            batch,
            c.kv_heads,
            capacity,
            c.head_dim,
            window=c.sliding_window,
            dtype=dtype or p.dtype,
            device=p.device,
        )

    def forward(
        self,
        ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        cache: Cache | None = None,
        aux: list[RouterStats] | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> Tensor:
        """(B, T) ids -> (B, T, V) next-token logits.  With a mixture of experts, each layer's
        router statistics (load-balancing loss, dropped assignments) are appended to ``aux``.

        With ``targets`` (B, T) -- the next token at every position, -100 where there is none
        -- the mean cross entropy instead, computed without the (B, T, V) logits.
        """
        x = self._run(ids, attention_mask, cache, None, aux)  # (B, T, C)
        if targets is None:
            return self.head(x)
        return self.output_loss(x, targets, label_smoothing=label_smoothing)

    def forward_with_weights(
        self, ids: Tensor, *, attention_mask: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """Logits and every layer's (B, H, T, T) attention weights (reference backend)."""
        weights: Weights = []
        x = self._run(ids, attention_mask, None, weights, None)
        return self.head(x), [w for w in weights if w is not None]

    def _run(
        self,
        ids: Tensor,
        attention_mask: Tensor | None,
        cache: Cache | None,
        weights: Weights | None,
        aux: list[RouterStats] | None,
    ) -> Tensor:
        check_ids(ids, self.config.vocab_size)
        t = ids.shape[1]
        offset = 0 if cache is None else cache.length
        if attention_mask is not None:
            check_token_mask(attention_mask, ids)
        positions = self._positions(t, offset, ids.device)  # (T,)
        key_mask = None  # (B, S) True at real tokens
        if cache is not None and (cache.key_mask is not None or attention_mask is not None):
            new = (
                attention_mask
                if attention_mask is not None
                else torch.ones_like(ids, dtype=torch.bool)
            )
            key_mask, positions = cache.append_key_mask(new)  # positions: (B, T)
        elif attention_mask is not None:
            key_mask = attention_mask
            # Count only real tokens: left padding does not shift a prompt's positions.
            positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        x = self.embed(ids, positions)  # (B, T, C)
        mask = None if key_mask is None else key_padding_to_attention(key_mask)  # (B, 1, 1, S)
        x = self.decoder(
            x,
            mask=mask,
            is_causal=True,
            window=self.config.sliding_window,
            rotary=self._rotary(positions),
            caches=None if cache is None else cache.layers,
            weights=weights,
            aux=aux,
        )
        return x  # (B, T, C): the head is applied by the caller
