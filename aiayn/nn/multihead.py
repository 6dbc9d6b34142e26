"""Multi-head attention (§3.2.2): h heads attend in parallel in d_k = d_model / h subspaces.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Self-attention projects one sequence to queries, keys and values with one fused matrix
``qkv`` = [W^Q; W^K; W^V] (the layout of ``torch.nn.MultiheadAttention.in_proj_weight``).
Cross-attention (§3.2.3, "encoder-decoder attention") takes queries from the decoder and keys
and values from the encoder output ``memory``, with ``q`` and a fused ``kv`` projection.
Beam search decodes K hypotheses of one sentence against the same memory: the memory may
then hold one row per group of consecutive query rows, and each group's queries are folded
into one row of K·T queries (:func:`fold_groups`), so the encoder's keys and values are
computed, cached and read once per sentence instead of once per beam.

``n_kv_heads`` < ``n_heads`` gives grouped-query attention (Ainslie et al., 2023); 1 gives
multi-query attention (Shazeer, 2019): groups of query heads share one key/value head, which
shrinks the KV cache by n_heads / n_kv_heads.

Shapes: B batch, T queries, S keys, H query heads, H_kv key/value heads, D head size,
C = d_model.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn import registry
from aiayn.nn.additive import additive_attention, additive_scores
from aiayn.nn.attention import attend, attention_scores
from aiayn.nn.context import AttentionRecord, Context
from aiayn.nn.linear import Linear
from aiayn.nn.masks import add_bias


def memory_groups(rows: int, memory_rows: int, memory: str, queries: str) -> int:
    """How many consecutive query rows share each memory row: 1, or K when beam search gives
    one memory row per sentence for its K beams.  ``memory`` and ``queries`` name the two in
    the error for any other count."""
    groups = rows // max(memory_rows, 1)
    if groups * memory_rows != rows:
        raise ValueError(
            f"{memory} has {memory_rows} rows for {rows} {queries} rows: expected as many, or"
            " one per group of equally many rows (beam search)"
        )
    return groups


def fold_groups(q: Tensor, rows: int) -> Tensor:
    """(R·G, H, T, D) queries -> (R, H, G·T, D): each group of G consecutive rows becomes one
    row whose queries are the group's, in order (queries attend independently, so this is
    exact)."""
    g = q.shape[0] // rows
    return q.unflatten(0, (rows, g)).transpose(1, 2).flatten(2, 3)


def unfold_groups(x: Tensor, groups: int) -> Tensor:
    """The inverse of :func:`fold_groups`: (R, H, G·T, X) -> (R·G, H, T, X)."""
    return x.unflatten(2, (groups, -1)).transpose(1, 2).flatten(0, 1)


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with H query heads and H_kv key/value heads.

    ``stream`` and ``layer`` say where the module sits (they name its records, and pick its
    layer's KV cache); the block that owns it sets them.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        d_head: int | None = None,
        cross: bool = False,
        bias: bool = True,
        qkv_bias: bool | None = None,
        attention_dropout: float = 0.0,
        backend: str = "sdpa",
        score: str = "dot",
        scaled: bool = True,
        stream: str = "self",
        layer: int = 0,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
            d_head = d_model // n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        if backend not in registry.names("attention_backend"):
            names = ", ".join(registry.names("attention_backend"))
            raise ValueError(f"attention_backend={backend!r} is invalid: expected one of {names}")
        # Import the backend now: an import inside a forward that torch.compile traces would
        # split its graph (a graph break) for good.
        registry.resolve("attention_backend", backend)
        if score not in ("dot", "additive"):
            raise ValueError(f"attention score={score!r} is invalid: expected 'dot' or 'additive'")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.cross = cross
        self.attention_dropout = attention_dropout
        self.backend = backend
        self.stream, self.layer = ("cross" if cross else stream), layer
        # Eq. (1) divides by sqrt(d_k) "to counteract" large dot products (§3.2.1); ``scaled =
        # False`` is the ablation that drops it.  Additive scores have no scale.
        self.scale = 1.0 / math.sqrt(d_head) if scaled else 1.0
        # Additive (Bahdanau) scores w_h^T tanh(q + k): one vector w_h per head
        # (aiayn/nn/additive.py); None for the paper's dot product.
        self.score_w: nn.Parameter | None = None
        if score == "additive":
            self.score_w = nn.Parameter(torch.randn(n_heads, d_head) * d_head**-0.5)
        q_dim, kv_dim = n_heads * d_head, n_kv_heads * d_head
        self.split = (q_dim, kv_dim, kv_dim)
        in_bias = bias if qkv_bias is None else qkv_bias  # Qwen2: on Q, K, V but not W^O
        if cross:
            self.q = Linear(d_model, q_dim, bias=in_bias)
            self.kv = Linear(d_model, 2 * kv_dim, bias=in_bias)
        else:
            self.qkv = Linear(d_model, q_dim + 2 * kv_dim, bias=in_bias)
        self.out = Linear(q_dim, d_model, bias=bias)  # W^O

    def _heads(self, x: Tensor, n: int) -> Tensor:
        return x.unflatten(-1, (n, self.d_head)).transpose(1, 2)  # (B, T, n*D) -> (B, n, T, D)

    def self_qkv(self, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention's queries (B, H, T, D), keys and values (B, H_kv, T, D) of ``x``,
        with the context's positions applied to q and k (RoPE)."""
        q, k, v = self.qkv(x).split(self.split, dim=-1)  # (B, T, (H + 2 H_kv) D)
        q, k, v = (
            self._heads(q, self.n_heads),
            self._heads(k, self.n_kv_heads),
            self._heads(v, self.n_kv_heads),
        )
        q, k = ctx.positions.on_qk(q, k)
        return q, k, v

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of the encoder output: (B, H_kv, S, D) each."""
        k, v = self.kv(memory).chunk(2, dim=-1)  # (B, S, H_kv*D) each
        return self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)

    def _cross_kv(self, ctx: Context) -> tuple[Tensor, Tensor]:
        layer = None if ctx.cache is None else ctx.cache.layers[self.layer]
        if layer is not None and layer.cross_kv is not None:
            return layer.cross_kv  # computed on the first decoding step
        if ctx.memory is None:
            raise ValueError("cross-attention needs the encoder output (memory) on its first step")
        kv = self.project_memory(ctx.memory)
        if layer is not None:
            layer.cross_kv = kv
        return kv

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        """Attend from ``x`` (B, T, C) to itself, or (cross) to ``ctx.memory`` (B, S, C).

        Self-attention applies the context's mask, causality, window and positions and appends
        its keys and values to the context's cache; cross-attention uses the memory's padding
        mask.  Records weights and scores when ``ctx.record`` asks.  Returns (B, T, C).
        """
        if x.dim() != 3:
            raise ValueError(f"attention input must be (B, T, d_model), got {tuple(x.shape)}")
        groups = 1
        if self.cross:
            q = self._heads(self.q(x), self.n_heads)  # (B, H, T, D)
            k, v = self._cross_kv(ctx)  # (B', H_kv, S, D): B' = B, or B / G sentences
            mask, causal, window = ctx.memory_mask, False, None
            groups = memory_groups(q.shape[0], k.shape[0], "cross-attention memory", "query")
            if groups > 1:
                q = fold_groups(q, k.shape[0])  # (B/G, H, G·T, D)
        else:
            q, k, v = self.self_qkv(x, ctx)
            if ctx.cache is not None:
                k, v = ctx.cache.layers[self.layer].self_kv.update(k, v)  # (B, H_kv, S, D)
            mask = add_bias(ctx.mask, ctx.positions.score_bias())
            causal, window = ctx.causal, ctx.window
        record = ctx.record
        want = record is not None and record.wants_attention
        scores: Tensor | None = None
        weights: Tensor | None
        if self.score_w is not None:
            dropout = self.attention_dropout if self.training else 0.0
            out, additive_weights = additive_attention(
                q, k, v, self.score_w, mask, is_causal=causal, window=window, dropout_p=dropout
            )  # (B, H, T, D), (B, H, T, S)
            weights = additive_weights.detach()
            if want and record.scores:  # type: ignore[union-attr]
                scores = additive_scores(q, k, self.score_w)
        else:
            out, weights = attend(
                q,
                k,
                v,
                mask,
                is_causal=causal,
                window=window,
                scale=self.scale,
                dropout_p=self.attention_dropout if self.training else 0.0,
                return_weights=want and record.weights,  # type: ignore[union-attr]
                backend_name="reference" if want else self.backend,
            )
            if want and record.scores:  # type: ignore[union-attr]
                scores = attention_scores(q, k, self.scale)
        if want:
            assert record is not None
            weights = weights if record.weights else None
            scores = None if scores is None else scores.detach().float()
            if groups > 1:  # one record row per query row
                weights = None if weights is None else unfold_groups(weights, groups)
                scores = None if scores is None else unfold_groups(scores, groups)
            record.attention.append(
                AttentionRecord(self.stream, self.layer, weights, scores, causal, window)
            )
        if groups > 1:
            out = unfold_groups(out, groups)  # (B, H, T, D)
        return self.out(out.transpose(1, 2).flatten(2))  # (B, H, T, D) -> (B, T, C)

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
