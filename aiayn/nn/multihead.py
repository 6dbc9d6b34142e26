"""Multi-head attention (§3.2.2): h heads attend in parallel in d_k = d_model / h subspaces.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Self-attention projects one sequence to queries, keys and values with one fused matrix
``qkv`` = [W^Q; W^K; W^V] (the layout of ``torch.nn.MultiheadAttention.in_proj_weight``).
Cross-attention (§3.2.3, "encoder-decoder attention") takes queries from the decoder and keys
and values from the encoder output ``memory``, with ``q`` and a fused ``kv`` projection.

``n_kv_heads`` < ``n_heads`` gives grouped-query attention (Ainslie et al., 2023); 1 gives
multi-query attention (Shazeer, 2019): groups of query heads share one key/value head, which
shrinks the KV cache by n_heads / n_kv_heads.

Shapes: B batch, T queries, S keys, H query heads, H_kv key/value heads, D head size,
C = d_model.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.nn.attention import scaled_dot_product_attention
from aiayn.nn.cache import KVCache
from aiayn.nn.linear import Linear
from aiayn.nn.positions import apply_rotary

Rotary = tuple[Tensor, Tensor]


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        d_head: int | None = None,
        cross: bool = False,
        bias: bool = True,
        attention_dropout: float = 0.0,
        backend: str = "sdpa",
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
            d_head = d_model // n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.cross = cross
        self.attention_dropout = attention_dropout
        self.backend = backend
        q_dim, kv_dim = n_heads * d_head, n_kv_heads * d_head
        if cross:
            self.q = Linear(d_model, q_dim, bias=bias)
            self.kv = Linear(d_model, 2 * kv_dim, bias=bias)
        else:
            self.qkv = Linear(d_model, q_dim + 2 * kv_dim, bias=bias)
        self.out = Linear(q_dim, d_model, bias=bias)  # W^O

    def _heads(self, x: Tensor, n: int) -> Tensor:
        return x.unflatten(-1, (n, self.d_head)).transpose(1, 2)  # (B, T, n*D) -> (B, n, T, D)

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output: (B, H_kv, S, D) each."""
        k, v = self.kv(memory).chunk(2, dim=-1)  # (B, S, H_kv*D) each
        return self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        mask: Tensor | None = None,
        is_causal: bool = False,
        window: int | None = None,
        rotary: Rotary | None = None,
        cache: KVCache | None = None,
        cross_kv: tuple[Tensor, Tensor] | None = None,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, T, C) to itself, or to ``memory`` (B, S, C) if cross.

        Args:
            mask: boolean (True = may attend) broadcastable to (B, H, T, S).
            is_causal / window: the decoder's causal (optionally sliding-window) constraint.
            rotary: (cos, sin) for the T query positions (RoPE; self-attention only).
            cache: self-attention KV cache; the new keys/values are appended to it.
            cross_kv: precomputed cross-attention keys/values (see :meth:`project_memory`).
            return_weights: also return (B, H, T, S) weights (uses the reference backend).

        Returns:
            (B, T, C) output and the weights (or None).
        """
        if x.dim() != 3:
            raise ValueError(f"attention input must be (B, T, d_model), got {tuple(x.shape)}")
        if self.cross:
            q = self._heads(self.q(x), self.n_heads)  # (B, H, T, D)
            if cross_kv is None:
                if memory is None:
                    raise ValueError("cross-attention needs memory= (the encoder output)")
                cross_kv = self.project_memory(memory)
            k, v = cross_kv  # (B, H_kv, S, D)
        else:
            q_dim, kv_dim = self.n_heads * self.d_head, self.n_kv_heads * self.d_head
            qkv = self.qkv(x)  # (B, T, (H + 2 H_kv) D)
            q, k, v = qkv.split((q_dim, kv_dim, kv_dim), dim=-1)
            q, k, v = (
                self._heads(q, self.n_heads),
                self._heads(k, self.n_kv_heads),
                self._heads(v, self.n_kv_heads),
            )
            if rotary is not None:
                cos, sin = rotary
                q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            if cache is not None:
                k, v = cache.update(k, v)  # (B, H_kv, S, D)
        backend = "reference" if return_weights else self.backend
        result = scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            is_causal=is_causal,
            window=window,
            dropout_p=self.attention_dropout if self.training else 0.0,
            return_weights=return_weights,
            backend=backend,
        )
        out, weights = result if isinstance(result, tuple) else (result, None)
        out = out.transpose(1, 2).flatten(2)  # (B, H, T, D) -> (B, T, H*D)
        return self.out(out), weights

    @torch.no_grad()
    def load_from_torch(self, ref: nn.MultiheadAttention) -> None:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same d_model and heads)."""
        if self.n_kv_heads != self.n_heads or ref.num_heads != self.n_heads:
            raise ValueError("torch.nn.MultiheadAttention has n_kv_heads == n_heads only")
        assert ref.in_proj_weight is not None and ref.in_proj_bias is not None
        if self.cross:
            self.q.weight.copy_(ref.in_proj_weight[: ref.embed_dim])
            self.kv.weight.copy_(ref.in_proj_weight[ref.embed_dim :])
            self.q.bias.copy_(ref.in_proj_bias[: ref.embed_dim])
            self.kv.bias.copy_(ref.in_proj_bias[ref.embed_dim :])
        else:
            self.qkv.weight.copy_(ref.in_proj_weight)
            self.qkv.bias.copy_(ref.in_proj_bias)
        self.out.weight.copy_(ref.out_proj.weight)
        self.out.bias.copy_(ref.out_proj.bias)
