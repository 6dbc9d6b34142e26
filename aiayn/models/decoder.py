"""Decoder-only language model (GPT: Radford et al., 2018/2019; Llama: Touvron et al., 2023).

The paper's decoder without cross-attention: a stack of causally masked blocks predicting the
next token, ``p(x_{t+1} | x_{<=t})`` for every t in one pass.

Left padding (batched prompts of different lengths) is handled by an explicit
``attention_mask`` (B, T) -- True at real tokens.  Positions then count real tokens only, so a
left-padded prompt sees exactly the positions it would see alone; the padded keys are hidden
from every query.  With a ``Cache`` the model appends to it and the new
tokens continue at the cached length -- a decoding step is this same forward pass on one
token per row (aiayn/generate/lm.py).

Shapes: B batch, T new positions, S all positions (cached + new), C = d_model, V vocabulary.
"""

from __future__ import annotations

from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.models.base import Stack, TransformerModel
from aiayn.nn.cache import Cache
from aiayn.nn.context import Record
from aiayn.nn.embedding import Embeddings, check_ids, check_token_mask
from aiayn.nn.linear import Linear
from aiayn.nn.static_cache import StaticCache


class DecoderLM(TransformerModel):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.arch != "decoder":
            raise UserError(f"DecoderLM needs arch='decoder', got {config.arch!r}")
        c = config
        self.cache_layers = c.n_layers
        self.embed = Embeddings(c, c.vocab_size)
        self.decoder = Stack(c, c.n_layers)
        self.head = Linear(c.d_model, c.vocab_size, bias=c.head_bias)
        self.init_weights()
        if c.tie_embeddings:
            self.head.weight = self.embed.token.weight

    def forward(
        self,
        ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        cache: Cache | StaticCache | None = None,
        record: Record | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
        last_only: bool = False,
    ) -> Tensor:
        """(B, T) ids -> (B, T, V) next-token logits; (B, 1, V) with ``last_only``, the last
        position's alone (what a prompt's prefill needs: the output projection over every
        position of a prompt costs as much as that many decoding steps' projections).

        ``record`` collects intermediates (attention weights or scores, router statistics of a
        mixture of experts; aiayn/nn/context.py).  With ``targets`` (B, T) -- the next token at
        every position, -100 where there is none -- the mean cross entropy instead, computed
        without the (B, T, V) logits.
        """
        check_ids(ids, self.config.vocab_size)
        if attention_mask is not None:
            check_token_mask(attention_mask, ids)
        x, ctx = self.embed_context(
            self.embed, ids, attention_mask, cache, causal=True, record=record
        )
        x = self.decoder(x, ctx)  # (B, T, C)
        if targets is None:
            return self.head(x[:, -1:] if last_only else x)
        return self.output_loss(x, targets, label_smoothing=label_smoothing)

    def forward_with_weights(
        self, ids: Tensor, *, attention_mask: Tensor | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """Logits and every layer's (B, H, T, T) attention weights (reference backend)."""
        record = Record(weights=True)
        logits = self(ids, attention_mask=attention_mask, record=record)
        return logits, [a.weights for a in record.attention if a.weights is not None]
