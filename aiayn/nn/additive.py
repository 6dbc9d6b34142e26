"""Additive attention (Bahdanau et al., 2015), the alternative §3.2.1 of the paper sets aside:

    score(q_t, k_s) = w^T tanh(q_t + k_s)        (per head; q_t = W q, k_s = U k)

"Additive attention computes the compatibility function using a feed-forward network with a
single hidden layer" -- here the hidden layer is the head's d_k-wide query and key projections
(the W and U of Bahdanau's ``v^T tanh(W s + U h)``) and ``w`` is one learned vector per head.
The paper chose the dot product because it is a matrix multiplication: additive scores need a
(T, S, d_k) tensor of sums per head, which costs O(T·S·d_k) memory where the dot product needs
O(T·S).  The masks, the softmax and the weighted sum of values are Eq. (1)'s
(``aiayn.nn.attention.masked_softmax``), so the two differ only in the score.

This is the ``attention_score = "additive"`` ablation of the model config (Table 3 of the paper
compares the two only in prose: "dot-product attention is much faster and more
space-efficient in practice").

Shapes: B batch, H query heads, H_kv key/value heads, T queries, S keys, D head size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.nn.attention import AttentionCall, masked_softmax


def _expand_kv(x: Tensor, heads: int) -> Tensor:
    """(B, H_kv, S, D) -> (B, H, S, D): grouped-query heads share their key/value head."""
    groups = heads // x.shape[-3]
    return x.repeat_interleave(groups, dim=-3) if groups > 1 else x


def additive_scores(q: Tensor, k: Tensor, w: Tensor) -> Tensor:
    """w_h^T tanh(q_t + k_s) for every head, query and key: (B, H, T, D), (B, H_kv, S, D) and
    (H, D) -> (B, H, T, S)."""
    keys = _expand_kv(k, q.shape[-3])
    hidden = torch.tanh(q.unsqueeze(-2) + keys.unsqueeze(-3))  # (B, H, T, S, D)
    return torch.einsum("bhtsd,hd->bhts", hidden, w)


def additive_attention(
    q: Tensor, k: Tensor, v: Tensor, w: Tensor, call: AttentionCall
) -> tuple[Tensor, Tensor]:
    """softmax(additive scores + mask) V: the (B, H, T, D) output and (B, H, T, S) weights.
    ``call``'s mask, causality, window and dropout mean what they mean in Eq. (1)'s backends;
    its scale is not used (additive scores have none)."""
    call = call.for_lengths(q.shape[-2], k.shape[-2])
    weights = masked_softmax(
        additive_scores(q, k, w), call.mask, is_causal=call.causal, window=call.window
    )
    p = call.dropout_p
    mixed = F.dropout(weights, p=p) if p > 0 else weights
    return torch.matmul(mixed, _expand_kv(v, q.shape[-3])), weights
