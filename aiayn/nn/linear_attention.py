"""Linear attention (Katharopoulos et al., 2020, "Transformers are RNNs"): causal attention in
O(n) time and O(1) decoding state.

Replace softmax(q·k) by a kernel φ(q)·φ(k) with the positive feature map φ(x) = elu(x) + 1.
The weighted sum then factors through a running state::

    out_i = φ(q_i)ᵀ S_i / φ(q_i)ᵀ z_i,     S_i = Σ_{j≤i} φ(k_j) v_jᵀ  (D × D_v),
                                            z_i = Σ_{j≤i} φ(k_j)       (D)

* Training (the parallel form): the sequence is cut into chunks of C positions.  Inside a
  chunk the causal C × C kernel matrix is used directly; the state carries everything before
  the chunk.  O(T·C·D + T·D²) work, O(T·D + D²) memory -- no T × T matrix anywhere.
* Decoding (the recurrent form): each new token adds φ(k) vᵀ to S and φ(k) to z: a state of
  D × (D_v + 1) numbers per head, whatever the length -- no growing cache.

Both forms are one function, ``linear_attention``, run with or without a carried state;
tests/nn/test_linear_attention.py checks them against each other and against the O(T²)
formula written out.  A padded position (``keep`` False) adds nothing to the state, so left
padding changes nothing for the real tokens.

Shapes: B batch, H heads, T positions, D key size, E value size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.errors import UserError
from aiayn.nn.context import Context
from aiayn.nn.multihead import SelfAttention

CHUNK = 64
EPS = 1e-6  # keeps the normaliser away from 0 in fp16/bf16 (it is a sum of positives)


def feature_map(x: Tensor) -> Tensor:
    """φ(x) = elu(x) + 1 > 0 elementwise (Katharopoulos et al., §3.2)."""
    return F.elu(x) + 1.0


@dataclass
class LinearState:
    """The running sums of one layer: S (B, H, D, E) and z (B, H, D)."""

    s: Tensor
    z: Tensor

    def reorder(self, index: Tensor) -> None:
        self.s, self.z = self.s.index_select(0, index), self.z.index_select(0, index)

    def nbytes(self) -> int:
        return self.s.numel() * self.s.element_size() + self.z.numel() * self.z.element_size()


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    keep: Tensor | None = None,
    state: LinearState | None = None,
    chunk: int = CHUNK,
) -> tuple[Tensor, LinearState]:
    """Causal linear attention of (B, H, T, D) queries and keys and (B, H, T, E) values,
    continuing ``state`` (the positions before these T; None = none).  ``keep`` (B, T) is False
    at padding, which then adds nothing.  Returns the (B, H, T, E) output and the state after
    the T positions.  Grouped-query keys (fewer heads than the queries) are shared."""
    if k.shape[1] != q.shape[1]:  # GQA: each key/value head serves a group of query heads
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    b, h, _, d = q.shape
    e = v.shape[-1]
    work = torch.promote_types(q.dtype, torch.float32)  # the sums accumulate in >= fp32
    fq, fk, v = feature_map(q).to(work), feature_map(k).to(work), v.to(work)
    if keep is not None:
        fk = fk * keep[:, None, :, None].to(work)  # padding contributes no key
    if state is None:
        s = torch.zeros(b, h, d, e, dtype=work, device=q.device)
        z = torch.zeros(b, h, d, dtype=work, device=q.device)
    else:
        s, z = state.s.to(work), state.z.to(work)
    outs = []
    # split, not slicing: a slice's backward writes a full-length zero gradient, T/C times
    # over (quadratic in T); split's gathers the chunks' gradients once.
    for cq, ck, cv in zip(fq.split(chunk, 2), fk.split(chunk, 2), v.split(chunk, 2), strict=True):
        within = (cq @ ck.transpose(-1, -2)).tril()  # (B, H, C, C): φ(q_i)·φ(k_j), j <= i
        numerator = within @ cv + cq @ s  # (B, H, C, E)
        denominator = within.sum(-1) + (cq @ z[..., None])[..., 0]  # (B, H, C)
        outs.append(numerator / (denominator[..., None] + EPS))
        s = s + ck.transpose(-1, -2) @ cv  # (B, H, D, E)
        z = z + ck.sum(2)
    out = torch.cat(outs, dim=2) if outs else v.new_zeros(b, h, 0, e)
    return out.to(q.dtype), LinearState(s, z)


def linear_attention_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The O(T²) formula written out, for tests: out_i = Σ_{j≤i} (φ(q_i)·φ(k_j)) v_j / Σ_{j≤i}
    φ(q_i)·φ(k_j)."""
    scores = feature_map(q) @ feature_map(k).transpose(-1, -2)  # (B, H, T, T)
    scores = scores.tril()
    return (scores @ v) / (scores.sum(-1, keepdim=True) + EPS)


class LinearSelfAttention(SelfAttention):
    """Multi-head causal self-attention with the linear kernel in place of the softmax: the
    same projections (W^Q, W^K, W^V fused, W^O) and heads as ``SelfAttention``, so
    parameter counts match; positions that act on q and k (RoPE) apply as usual.  With a
    cache, the layer keeps a ``LinearState`` instead of keys and values."""

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        if not ctx.causal:
            raise UserError("linear attention is causal self-attention (decoder-only models)")
        q, k, v = self.self_qkv(x, ctx)
        keep = ctx.new_token_keep(x.shape[1])  # (B, T) or None
        if ctx.cache is None:
            out, _ = linear_attention(q, k, v, keep=keep)
        else:
            layer = ctx.cache.layers[self.layer]
            state = layer.state if isinstance(layer.state, LinearState) else None
            out, layer.state = linear_attention(q, k, v, keep=keep, state=state)
        return self.out(out.transpose(1, 2).flatten(2))  # (B, T, H*D) -> (B, T, C)
