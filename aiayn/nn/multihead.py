"""Multi-head attention (§3.2.2): h heads attend in parallel in d_k = d_model / h subspaces.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

``SelfAttention`` projects one sequence to queries, keys and values with one fused
matrix ``qkv`` = [W^Q; W^K; W^V] (the layout of ``torch.nn.MultiheadAttention.in_proj_weight``).
``CrossAttention`` (§3.2.3, "encoder-decoder attention") takes queries from the decoder
and keys and values from the encoder output ``memory``, with ``q`` and a fused ``kv``
projection.  Both share ``MultiHeadAttention``: the split into heads, the output
projection W^O, the scale, the optional additive score and the recording of weights.
Beam search decodes K hypotheses of one sentence against the same memory: the memory may
then hold one row per group of consecutive query rows, and each group's queries are folded
into one row of K·T queries (``fold_groups``), so the encoder's keys and values are
computed, cached and read once per sentence instead of once per beam.

``n_kv_heads`` < ``n_heads`` gives grouped-query attention (Ainslie et al., 2023); 1 gives
multi-query attention (Shazeer, 2019): groups of query heads share one key/value head, which
shrinks the KV cache by n_heads / n_kv_heads.

Shapes: B batch, T queries, S keys, H query heads, H_kv key/value heads, D head size,
C = d_model.
"""

from __future__ import annotations

import math
from typing import Any, Self

import torch
from torch import Tensor, nn

from aiayn import registry
from aiayn.config import AttentionConfig
from aiayn.errors import UserError
from aiayn.nn.additive import additive_attention, additive_scores
from aiayn.nn.attention import AttentionCall, attend, attention_scores
from aiayn.nn.context import AttentionRecord, Context
from aiayn.nn.linear import Linear
from aiayn.nn.masks import add_bias


def memory_groups(rows: int, memory_rows: int, memory: str, queries: str) -> int:
    """How many consecutive query rows share each memory row: 1, or K when beam search gives
    one memory row per sentence for its K beams.  ``memory`` and ``queries`` name the two in
    the error for any other count."""
    groups = rows // max(memory_rows, 1)
    if groups * memory_rows != rows:
        raise UserError(
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
    """The inverse of ``fold_groups``: (R, H, G·T, X) -> (R·G, H, T, X)."""
    return x.unflatten(2, (groups, -1)).transpose(1, 2).flatten(0, 1)


class MultiHeadAttention(nn.Module):
    """What self- and cross-attention share: H query heads and H_kv key/value heads of size D,
    the output projection W^O, the scale of Eq. (1) and how one call of Eq. (1) is made and
    recorded (``attend_heads``).  The subclasses own their input projections.

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
                raise UserError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
            d_head = d_model // n_heads
        if n_heads % n_kv_heads:
            raise UserError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        if backend not in registry.names("attention_backend"):
            names = ", ".join(registry.names("attention_backend"))
            raise UserError(f"attention_backend={backend!r} is invalid: expected one of {names}")
        # Import the backend now: an import inside a forward that torch.compile traces would
        # split its graph (a graph break) for good.
        registry.resolve("attention_backend", backend)
        if score not in ("dot", "additive"):
            raise UserError(f"attention score={score!r} is invalid: expected 'dot' or 'additive'")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_head
        self.attention_dropout = attention_dropout
        self.backend = backend
        self.stream, self.layer = stream, layer
        # Eq. (1) divides by sqrt(d_k) "to counteract" large dot products (§3.2.1); ``scaled =
        # False`` is the ablation that drops it.  Additive scores have no scale.
        self.scale = 1.0 / math.sqrt(d_head) if scaled else 1.0
        # Additive (Bahdanau) scores w_h^T tanh(q + k): one vector w_h per head
        # (aiayn/nn/additive.py); None for the paper's dot product.
        self.score_w: nn.Parameter | None = None
        if score == "additive":
            self.score_w = nn.Parameter(torch.randn(n_heads, d_head) * d_head**-0.5)
        self.q_dim, self.kv_dim = n_heads * d_head, n_kv_heads * d_head
        in_bias = bias if qkv_bias is None else qkv_bias  # Qwen2: on Q, K, V, not W^O
        self.build_inputs(d_model, in_bias)  # before W^O: the order of initialisation
        self.out = Linear(self.q_dim, d_model, bias=bias)  # W^O

    @classmethod
    def from_config(
        cls,
        attention: AttentionConfig,
        d_model: int,
        *,
        bias: bool = True,
        stream: str = "self",
        layer: int = 0,
    ) -> Self:
        """The attention a model's ``AttentionConfig`` describes, at width ``d_model``;
        ``bias`` is the model's (the Q, K, V projections follow ``attention.qkv_bias``)."""
        a = attention
        return cls(
            d_model,
            a.n_heads,
            a.n_kv_heads,
            d_head=a.d_head,
            bias=bias,
            qkv_bias=a.qkv_bias,
            attention_dropout=a.dropout,
            backend=a.backend,
            score=a.score,
            scaled=a.scale,
            stream=stream,
            layer=layer,
        )

    def build_inputs(self, d_model: int, bias: bool) -> None:
        """Create the input projections (a subclass's own)."""
        raise NotImplementedError

    def heads(self, x: Tensor, n: int) -> Tensor:
        """(B, T, n·D) -> (B, n, T, D)."""
        return x.unflatten(-1, (n, self.d_head)).transpose(1, 2)

    def call(
        self,
        mask: Tensor | None,
        causal: bool,
        window: int | None,
        weights: bool,
        row_groups: tuple[tuple[int, int, int], ...] | None = None,
    ) -> AttentionCall:
        """This module's call of Eq. (1) with the given mask, causality, window and ragged row
        groups (a serving pool's decoding step)."""
        return AttentionCall(
            scale=self.scale,
            mask=mask,
            causal=causal,
            window=window,
            dropout_p=self.attention_dropout if self.training else 0.0,
            return_weights=weights,
            row_groups=row_groups,
        )

    def attend_heads(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        ctx: Context,
        call: AttentionCall,
        groups: int = 1,
        out_dtype: torch.dtype | None = None,
    ) -> Tensor:
        """Eq. (1) over the heads, then Concat(heads) W^O: (B, H, T', D) queries, (B', H_kv,
        S, D) keys and values -> (B, T, C).  ``groups`` > 1 when beam search folded G rows'
        queries into one row per memory row (T' = G·T, B' = B / G).  Records weights and
        scores, one record row per query row, when ``ctx.record`` asks.  ``out_dtype``: the
        dtype W^O takes, when attention ran in another (a KV cache kept in bf16)."""
        record = ctx.record
        want = record is not None and record.wants_attention
        scores: Tensor | None = None
        weights: Tensor | None
        if self.score_w is not None:
            out, additive_weights = additive_attention(q, k, v, self.score_w, call)
            weights = additive_weights.detach()  # (B, H, T, S)
            if want and record.scores:  # type: ignore[union-attr]
                scores = additive_scores(q, k, self.score_w)
        else:
            backend = "reference" if want else self.backend  # only it returns weights
            out, weights = attend(q, k, v, call, backend)  # (B, H, T, D)
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
                AttentionRecord(self.stream, self.layer, weights, scores, call.causal, call.window)
            )
        if groups > 1:
            out = unfold_groups(out, groups)  # (B, H, T, D)
        if out_dtype is not None:
            out = out.to(out_dtype)
        return self.out(out.transpose(1, 2).flatten(2))  # (B, H, T, D) -> (B, T, C)

    @staticmethod
    def check_input(x: Tensor) -> None:
        if x.dim() != 3:
            raise UserError(f"attention input must be (B, T, d_model), got {tuple(x.shape)}")


class SelfAttention(MultiHeadAttention):
    """Attention of a sequence to itself, with the context's mask, causality, window,
    positions and KV cache; one fused ``qkv`` projection [W^Q; W^K; W^V]."""

    def build_inputs(self, d_model: int, bias: bool) -> None:
        self.split = (self.q_dim, self.kv_dim, self.kv_dim)
        self.qkv = Linear(d_model, self.q_dim + 2 * self.kv_dim, bias=bias)  # [W^Q; W^K; W^V]

    def self_qkv(self, x: Tensor, ctx: Context) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, D), keys and values (B, H_kv, T, D) of ``x``, with the context's
        positions applied to q and k (RoPE)."""
        q, k, v = self.qkv(x).split(self.split, dim=-1)  # (B, T, (H + 2 H_kv) D)
        q, k, v = (
            self.heads(q, self.n_heads),
            self.heads(k, self.n_kv_heads),
            self.heads(v, self.n_kv_heads),
        )
        q, k = ctx.positions.on_qk(q, k)
        return q, k, v

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        """Attend from ``x`` (B, T, C) to itself (and the cached keys), appending its keys and
        values to the context's cache.  Returns (B, T, C)."""
        self.check_input(x)
        q, k, v = self.self_qkv(x, ctx)
        if ctx.cache is not None:
            k, v = ctx.cache.layers[self.layer].self_kv.update(k, v)  # (B, H_kv, S, D)
        mask = add_bias(ctx.mask, ctx.positions.score_bias())
        # A cache may keep keys and values in another dtype (aiayn/models/precision.py):
        # attention then runs in it, reading half the bytes of fp32 for a bf16 cache.
        other_dtype = k.dtype != q.dtype
        if other_dtype and mask is not None and mask.is_floating_point():
            mask = mask.to(k.dtype)
        weights = ctx.record is not None and ctx.record.weights
        groups = None if ctx.cache is None else ctx.cache.row_groups
        call = self.call(mask, ctx.causal, ctx.window, weights, groups)
        if not other_dtype:
            return self.attend_heads(q, k, v, ctx, call)
        return self.attend_heads(q.to(k.dtype), k, v, ctx, call, out_dtype=q.dtype)

    @torch.no_grad()
    def load_from_torch(self, ref: nn.MultiheadAttention) -> None:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same d_model and heads)."""
        _check_torch_reference(self, ref)
        self.qkv.weight.copy_(ref.in_proj_weight)
        self.qkv.bias.copy_(ref.in_proj_bias)
        self.out.weight.copy_(ref.out_proj.weight)
        self.out.bias.copy_(ref.out_proj.bias)


class CrossAttention(MultiHeadAttention):
    """Encoder-decoder attention (§3.2.3): queries from ``x``, keys and values from the
    context's encoder output ``memory`` (projected once, on the first decoding step, then
    cached), masked by the memory's padding."""

    def __init__(
        self, d_model: int, n_heads: int, n_kv_heads: int | None = None, **kw: Any
    ) -> None:
        kw.setdefault("stream", "cross")
        super().__init__(d_model, n_heads, n_kv_heads, **kw)

    def build_inputs(self, d_model: int, bias: bool) -> None:
        self.q = Linear(d_model, self.q_dim, bias=bias)  # W^Q
        self.kv = Linear(d_model, 2 * self.kv_dim, bias=bias)  # [W^K; W^V]

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output: (B, H_kv, S, D) each."""
        k, v = self.kv(memory).chunk(2, dim=-1)  # (B, S, H_kv*D) each
        return self.heads(k, self.n_kv_heads), self.heads(v, self.n_kv_heads)

    def memory_kv(self, ctx: Context) -> tuple[Tensor, Tensor]:
        """The memory's keys and values, from the cache after the first decoding step."""
        layer = None if ctx.cache is None else ctx.cache.layers[self.layer]
        if layer is not None and layer.cross_kv is not None:
            return layer.cross_kv  # computed on the first decoding step
        if ctx.memory is None:
            raise UserError("cross-attention needs the encoder output (memory) on its first step")
        kv = self.project_memory(ctx.memory)
        if layer is not None:
            # Contiguous, so that every later step's products read them in place: the split
            # into heads leaves (B, H_kv, S, D) strided, which each product would copy again.
            kv = (kv[0].contiguous(), kv[1].contiguous())
            layer.cross_kv = kv
        return kv

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        """Attend from ``x`` (B, T, C) to the memory (B', S, C): B' = B, or B / G sentences
        when beam search keeps one memory row for its G beams.  Returns (B, T, C)."""
        self.check_input(x)
        q = self.heads(self.q(x), self.n_heads)  # (B, H, T, D)
        k, v = self.memory_kv(ctx)  # (B', H_kv, S, D)
        groups = memory_groups(q.shape[0], k.shape[0], "cross-attention memory", "query")
        if groups > 1:
            q = fold_groups(q, k.shape[0])  # (B/G, H, G·T, D)
        weights = ctx.record is not None and ctx.record.weights
        call = self.call(ctx.memory_mask, False, None, weights)
        return self.attend_heads(q, k, v, ctx, call, groups)

    @torch.no_grad()
    def load_from_torch(self, ref: nn.MultiheadAttention) -> None:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (same d_model and heads)."""
        _check_torch_reference(self, ref)
        e = ref.embed_dim
        self.q.weight.copy_(ref.in_proj_weight[:e])
        self.kv.weight.copy_(ref.in_proj_weight[e:])
        self.q.bias.copy_(ref.in_proj_bias[:e])
        self.kv.bias.copy_(ref.in_proj_bias[e:])
        self.out.weight.copy_(ref.out_proj.weight)
        self.out.bias.copy_(ref.out_proj.bias)


def _check_torch_reference(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    if ours.n_kv_heads != ours.n_heads or ref.num_heads != ours.n_heads:
        raise UserError("torch.nn.MultiheadAttention has n_kv_heads == n_heads only")
    if ref.in_proj_weight is None or ref.in_proj_bias is None:
        raise UserError("torch.nn.MultiheadAttention needs its fused in_proj weight and bias")
