"""The Transformer block (§3.1, Figure 1): an attention sublayer and a feed-forward sublayer,
each wrapped in a residual connection and a normalisation.  A decoder block of an
encoder-decoder adds a cross-attention sublayer between the two.

Placement of the norm:

* post-LN, the paper: ``x = Norm(x + Dropout(Sublayer(x)))`` (§3.1, §5.4).
* pre-LN (GPT-2, Llama; Xiong et al., 2020): ``x = x + Dropout(Sublayer(Norm(x)))``, with one
  final norm after the last block -- the residual stream stays an identity path, which makes
  deep stacks train without warm-up tricks.

The three model families differ only in the context they pass in (aiayn/nn/context.py) and
in ``cross``.

Shapes: B batch, T positions, S memory positions, C = d_model.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import FeedForwardConfig, ModelConfig
from aiayn.nn.context import Context
from aiayn.nn.feedforward import build_feedforward
from aiayn.nn.linear_attention import LinearSelfAttention
from aiayn.nn.moe import MixtureOfExperts
from aiayn.nn.multihead import CrossAttention, SelfAttention
from aiayn.nn.norms import build_norm
from aiayn.nn.ssm import SelectiveSSM


def feed_forward_sublayer(ffn: FeedForwardConfig, d_model: int, bias: bool) -> nn.Module:
    """The position-wise feed-forward network of ``ffn`` (§3.3), or its mixture of experts."""
    if ffn.n_experts is None:
        return build_feedforward(d_model, ffn.d_ff, ffn.activation, bias)
    return MixtureOfExperts(
        d_model,
        ffn.d_ff,
        n_experts=ffn.n_experts,
        top_k=ffn.top_k,
        activation=ffn.activation,
        bias=bias,
        capacity_factor=ffn.capacity_factor,
    )


class Block(nn.Module):
    """Self-attention [+ cross-attention] + feed-forward, each with residual and norm.

    ``stream`` ("self", "encoder" or "decoder") and ``layer`` place the block in its model:
    they name what its attention records and pick its layer of a KV cache.
    """

    def __init__(
        self, config: ModelConfig, *, cross: bool = False, stream: str = "self", layer: int = 0
    ) -> None:
        super().__init__()
        c = config
        self.pre_norm = c.norm_position == "pre"
        self.residual = c.residual  # False: the ablation without residual connections
        mixer = c.mixer_at(layer)
        self.self_attn: nn.Module
        if mixer == "ssm":
            self.self_attn = SelectiveSSM.from_config(
                c.mixer, c.d_model, bias=c.bias, eps=c.norm_eps, layer=layer
            )
        else:
            kind = LinearSelfAttention if mixer == "linear" else SelfAttention
            self.self_attn = kind.from_config(
                c.attention, c.d_model, bias=c.bias, stream=stream, layer=layer
            )
        self.norm1 = build_norm(c.norm, c.d_model, c.norm_eps, c.bias)
        self.cross_attn = (
            CrossAttention.from_config(
                c.attention, c.d_model, bias=c.bias, stream="cross", layer=layer
            )
            if cross
            else None
        )
        self.norm_cross = build_norm(c.norm, c.d_model, c.norm_eps, c.bias) if cross else None
        self.ffn = feed_forward_sublayer(c.ffn, c.d_model, c.bias)
        self.norm2 = build_norm(c.norm, c.d_model, c.norm_eps, c.bias)
        self.dropout = c.dropout  # on each sublayer's output, before the residual add (§5.4)

    def _drop(self, h: Tensor) -> Tensor:
        # F.dropout, skipped outright in evaluation: decoding calls this twice per layer per token.
        return F.dropout(h, self.dropout) if self.training and self.dropout > 0 else h

    def _feed_forward(self, h: Tensor, ctx: Context) -> Tensor:
        if not isinstance(self.ffn, MixtureOfExperts):
            return self.ffn(h)
        out, stats = self.ffn(h)
        if ctx.record is not None:
            ctx.record.router.append(stats)
        return out

    def _add(self, x: Tensor, h: Tensor) -> Tensor:
        """The residual connection x + Dropout(h) -- or, in the ablation without it, h alone."""
        return x + self._drop(h) if self.residual else self._drop(h)

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        """(B, T, C) -> (B, T, C), attending as ``ctx`` says."""
        if self.pre_norm:
            x = self._add(x, self.self_attn(self.norm1(x), ctx))
            if self.cross_attn is not None:
                assert self.norm_cross is not None
                x = self._add(x, self.cross_attn(self.norm_cross(x), ctx))
            return self._add(x, self._feed_forward(self.norm2(x), ctx))
        x = self.norm1(self._add(x, self.self_attn(x, ctx)))
        if self.cross_attn is not None:
            assert self.norm_cross is not None
            x = self.norm_cross(self._add(x, self.cross_attn(x, ctx)))
        return self.norm2(self._add(x, self._feed_forward(x, ctx)))
