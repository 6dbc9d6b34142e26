"""The Transformer block (§3.1, Figure 1): an attention sublayer and a feed-forward sublayer,
each wrapped in a residual connection and a normalisation.  A decoder block of an
encoder-decoder adds a cross-attention sublayer between the two.

Placement of the norm:

* post-LN, the paper: ``x = Norm(x + Dropout(Sublayer(x)))`` (§3.1, §5.4).
* pre-LN (GPT-2, Llama; Xiong et al., 2020): ``x = x + Dropout(Sublayer(Norm(x)))``, with one
  final norm after the last block -- the residual stream stays an identity path, which makes
  deep stacks train without warm-up tricks.

The three model families differ only in the masks they pass in and in ``cross``.

Shapes: B batch, T positions, S memory positions, C = d_model.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.cache import LayerCache
from aiayn.nn.feedforward import build_feedforward
from aiayn.nn.moe import MixtureOfExperts, RouterStats
from aiayn.nn.multihead import MultiHeadAttention, Rotary
from aiayn.nn.norms import build_norm

Weights = list[Tensor | None]


class Block(nn.Module):
    """Self-attention [+ cross-attention] + feed-forward, each with residual and norm."""

    def __init__(self, config: ModelConfig, *, cross: bool = False) -> None:
        super().__init__()
        c = config
        self.pre_norm = c.norm_position == "pre"

        def attention(is_cross: bool) -> MultiHeadAttention:
            return MultiHeadAttention(
                c.d_model,
                c.n_heads,
                c.kv_heads,
                d_head=c.head_dim,
                cross=is_cross,
                bias=c.bias,
                attention_dropout=c.attention_dropout,
                backend=c.attention_backend,
            )

        self.self_attn = attention(False)
        self.norm1 = build_norm(c.norm, c.d_model, c.norm_eps, c.bias)
        self.cross_attn = attention(True) if cross else None
        self.norm_cross = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if cross else None
        self.ffn: nn.Module
        if c.n_experts is None:
            self.ffn = build_feedforward(c.d_model, c.d_ff, c.activation, c.bias)
        else:  # mixture of experts in place of the feed-forward sublayer
            self.ffn = MixtureOfExperts(
                c.d_model,
                c.d_ff,
                n_experts=c.n_experts,
                top_k=c.experts_top_k,
                activation=c.activation,
                bias=c.bias,
                capacity_factor=c.expert_capacity_factor,
            )
        self.norm2 = build_norm(c.norm, c.d_model, c.norm_eps, c.bias)
        self.dropout = c.dropout  # on each sublayer's output, before the residual add (§5.4)

    def _residual(self, x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self._drop(sublayer(norm(x)))
        return norm(x + self._drop(sublayer(x)))

    def _drop(self, h: Tensor) -> Tensor:
        # F.dropout, skipped outright in evaluation: decoding calls this twice per layer per token.
        return F.dropout(h, self.dropout) if self.training and self.dropout > 0 else h

    def forward(
        self,
        x: Tensor,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        window: int | None = None,
        rotary: Rotary | None = None,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: LayerCache | None = None,
        weights: Weights | None = None,
        aux: list[RouterStats] | None = None,
    ) -> Tensor:
        """(B, T, C) -> (B, T, C).  Appends attention weights to ``weights`` and mixture-of-experts
        router statistics to ``aux`` if given."""
        want = weights is not None

        def self_attention(h: Tensor) -> Tensor:
            out, w = self.self_attn(
                h,
                mask=mask,
                is_causal=is_causal,
                window=window,
                rotary=rotary,
                cache=None if cache is None else cache.self_kv,
                return_weights=want,
            )
            if weights is not None:
                weights.append(w)
            return out

        x = self._residual(x, self.norm1, self_attention)
        if self.cross_attn is not None:
            cross_attn, norm_cross = self.cross_attn, self.norm_cross
            assert norm_cross is not None

            def cross_attention(h: Tensor) -> Tensor:
                cross_kv = None
                if cache is not None:
                    if cache.cross_kv is None:
                        if memory is None:
                            raise ValueError("cross-attention needs memory= on the first step")
                        cache.cross_kv = cross_attn.project_memory(memory)
                    cross_kv = cache.cross_kv
                out, w = cross_attn(
                    h, memory, mask=memory_mask, cross_kv=cross_kv, return_weights=want
                )
                if weights is not None:
                    weights.append(w)
                return out

            x = self._residual(x, norm_cross, cross_attention)

        def feed_forward(h: Tensor) -> Tensor:
            if not isinstance(self.ffn, MixtureOfExperts):
                return self.ffn(h)
            out, stats = self.ffn(h)
            if aux is not None:
                aux.append(stats)
            return out

        return self._residual(x, self.norm2, feed_forward)
