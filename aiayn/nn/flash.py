"""FlashAttention: exact attention computed tile by tile, never holding the (T, S) matrix.

Dao, Fu, Ermon, Rudra and Ré (2022), "FlashAttention: Fast and Memory-Efficient Exact
Attention with IO-Awareness", with the loop order of Dao (2023), "FlashAttention-2"
(Algorithm 1: forward, Algorithm 2: backward).

Forward (Algorithm 1).  For each tile of query rows Q_i, walk over the key tiles K_j, V_j and
keep, per row, a running maximum m, a running sum l of exp(scores - m), and an unnormalised
output O.  When a new tile raises the maximum from m to m', everything accumulated so far is
rescaled by exp(m - m') (the "online softmax", Milakov and Gimelshein, 2018):

    S_ij = Q_i K_j^T · scale (+ masks)                      (tq, tk)
    m'   = max(m, rowmax(S_ij))
    P_ij = exp(S_ij - m')
    l    = exp(m - m') l + rowsum(P_ij)
    O    = exp(m - m') O + P_ij V_j

and finally O / l.  Only O and the log-sum-exp L = m + log(l) of each row are kept for the
backward pass: O(T) memory, not O(T·S).

Backward (Algorithm 2).  With D = rowsum(dO ∘ O), for each key tile (outer loop) and each
query tile (inner loop) the probabilities are recomputed from L rather than stored:

    P_ij  = exp(Q_i K_j^T · scale - L_i)
    dV_j += P_ij^T dO_i
    dP_ij = dO_i V_j^T
    dS_ij = P_ij ∘ (dP_ij - D_i)
    dQ_i += dS_ij K_j · scale
    dK_j += dS_ij^T Q_i · scale

Tiles that causality or the sliding window hide entirely are skipped, which roughly halves the
work of causal attention.  This is a readable PyTorch statement of the algorithm (the tiles are
batched matmuls over all batch and head pairs at once), not a fused kernel: the memory saving
is real, the IO-awareness is left to the CPU's caches.

Masks follow ``aiayn.nn.masks`` (True = may attend; causal aligned bottom-right; a window
of w lets the query at position p see keys in (p - w, p]).  A user mask broadcastable to
(..., T, S) is sliced tile by tile, never expanded.  Grouped-query attention maps query head
h to key/value head h // (H // H_kv) by stacking the G = H // H_kv query heads of a group as
extra rows of the query tile, so keys and values are never repeated.

Shapes: B batch, H query heads, H_kv key/value heads, G = H // H_kv, N = B·H_kv, T queries,
S keys, D head size (Dv for values), tq / tk query / key positions per tile.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.autograd.function import FunctionCtx, once_differentiable

from aiayn.errors import UserError

if TYPE_CHECKING:
    from aiayn.nn.attention import AttentionCall

# Rows per query tile (query positions × the G query heads of a group) and keys per key tile.
# Large enough that each tile's matmuls amortise Python's per-op overhead on CPU, small enough
# that a (rows, keys) block of scores stays in cache.
BLOCK_Q = 256
BLOCK_K = 256
# Scores are kept in base 2 (q pre-multiplied by log2(e)), so every exponential is an exp2:
# on CPU torch's exp2 runs faster than its exp, and exp2(x log2 e) = e^x.
LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)

_NEG_INF = float("-inf")


class _Tiling:
    """Which (query tile, key tile) pairs exist, and the causal / window mask inside each."""

    def __init__(
        self,
        t: int,
        s: int,
        *,
        is_causal: bool,
        window: int | None,
        block_q: int,
        block_k: int,
        device: torch.device,
    ) -> None:
        self.t, self.s = t, s
        self.causal = is_causal or window is not None
        self.window = window
        self.offset = s - t  # query i sits at absolute position offset + i (bottom-right)
        self.block_q, self.block_k = block_q, block_k
        self.device = device

    @staticmethod
    def _aligned(lo: int, hi: int, block: int, end: int) -> Iterator[tuple[int, int]]:
        """Tiles [start, stop) of the fixed grid (multiples of ``block``) overlapping [lo, hi)."""
        for start in range(lo // block * block, hi, block):
            yield start, min(start + block, end)

    def query_tiles(self) -> Iterator[tuple[int, int]]:
        return self._aligned(0, self.t, self.block_q, self.t)

    def key_tiles(self) -> Iterator[tuple[int, int]]:
        return self._aligned(0, self.s, self.block_k, self.s)

    def keys_seen_by(self, i0: int, i1: int) -> Iterator[tuple[int, int]]:
        """Key tiles that at least one query of [i0, i1) may attend to."""
        lo, hi = 0, self.s
        if self.causal:
            hi = min(self.s, self.offset + i1)  # the last query sees keys <= offset + i1 - 1
            if self.window is not None:  # the first query sees keys > offset + i0 - window
                lo = max(0, self.offset + i0 - self.window + 1)
        return self._aligned(lo, hi, self.block_k, self.s)

    def queries_seeing(self, j0: int, j1: int) -> Iterator[tuple[int, int]]:
        """Query tiles with at least one query that may attend to a key of [j0, j1)."""
        lo, hi = 0, self.t
        if self.causal:  # key j is seen from positions p with j <= p < j + window
            lo = max(0, j0 - self.offset)
            if self.window is not None:
                hi = min(self.t, j1 - 1 + self.window - self.offset)
        return self._aligned(lo, hi, self.block_q, self.t)

    def hidden(self, i0: int, i1: int, j0: int, j1: int) -> Tensor | None:
        """(tq, 1, tk) bool, True where causality / the window hides a key; None if none is."""
        if not self.causal:
            return None
        first, last = self.offset + i0, self.offset + i1 - 1  # positions of the tile's queries
        if j1 - 1 <= first and (self.window is None or j0 > last - self.window):
            return None  # the whole tile is visible
        q_pos = torch.arange(first, last + 1, device=self.device)[:, None, None]  # (tq, 1, 1)
        k_pos = torch.arange(j0, j1, device=self.device)[None, None, :]  # (1, 1, tk)
        hide = k_pos > q_pos
        if self.window is not None:
            hide |= k_pos <= q_pos - self.window
        return hide


class _TileMasks:
    """Applies causal / window masks and the user's mask to one tile of scores, in place."""

    def __init__(self, tiling: _Tiling, user: Tensor | None, b: int, h_kv: int, g: int) -> None:
        # ``user`` is (b', h_kv', T', G', S') with every dim 1 or full: True = hidden (bool)
        # or an additive float mask; it broadcasts against scores viewed as (B, H_kv, tq, G, tk).
        self.tiling, self.user = tiling, user
        self.b, self.h_kv, self.g = b, h_kv, g

    def apply(self, scores: Tensor, i0: int, i1: int, j0: int, j1: int, unit: float = 1.0) -> None:
        """Scores in units of ``unit`` nats (base-2 scores: log2(e)); float masks are scaled
        to match."""
        n, _, tk = scores.shape  # (N, tq*G, tk)
        tq = i1 - i0
        hide = self.tiling.hidden(i0, i1, j0, j1)
        if hide is not None:
            scores.view(n, tq, self.g, tk).masked_fill_(hide, _NEG_INF)
        if self.user is not None:
            u = self.user
            tile = u[
                :,
                :,
                slice(i0, i1) if u.shape[2] > 1 else slice(None),
                :,
                slice(j0, j1) if u.shape[4] > 1 else slice(None),
            ]  # (b', h_kv', tq', G', tk'): a view, never a copy
            grid = scores.view(self.b, self.h_kv, tq, self.g, tk)
            if tile.dtype == torch.bool:
                grid.masked_fill_(tile, _NEG_INF)
            else:
                grid.add_(tile, alpha=unit)


def _forward(
    q: Tensor, k: Tensor, v: Tensor, masks: _TileMasks, scale: float
) -> tuple[Tensor, Tensor]:
    """Algorithm 1.  q (N, T, G, D), k (N, S, D), v (N, S, Dv) -> out (N, T, G, Dv), lse (N, T, G)."""
    n, t, g, d = q.shape
    dv = v.shape[-1]
    tiling = masks.tiling
    out = q.new_empty(n, t, g, dv)
    lse = q.new_empty(n, t, g)
    k_t = k.transpose(1, 2)  # (N, D, S)
    # No row can be empty -- every query sees key 0, which its first key tile holds -- unless
    # a user mask, a window, or more queries than keys (causal) can hide all of a row's keys.
    # Then the -inf guard below is not needed.
    maskless = masks.user is None and tiling.window is None and tiling.offset >= 0
    for i0, i1 in tiling.query_tiles():
        q_i = q[:, i0:i1].reshape(n, -1, d) * (scale * LOG2E)  # (N, tq*G, D): base-2 scores
        rows = q_i.shape[1]
        row_max = q.new_full((n, rows, 1), _NEG_INF)  # m: running row maximum
        row_sum = q.new_zeros(n, rows, 1)  # l: running sum of exp(score - m)
        acc = q.new_zeros(n, rows, dv)  # O: unnormalised output
        for j0, j1 in tiling.keys_seen_by(i0, i1):
            s_ij = torch.bmm(q_i, k_t[:, :, j0:j1])  # (N, tq*G, tk)
            masks.apply(s_ij, i0, i1, j0, j1, LOG2E)
            new_max = torch.maximum(row_max, s_ij.amax(dim=-1, keepdim=True))  # (N, tq*G, 1)
            # A row that has seen no allowed key yet has m' = -inf; subtract 0 instead so
            # that exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN.
            safe_max = new_max if maskless else new_max.masked_fill(new_max == _NEG_INF, 0.0)
            p_ij = s_ij.sub_(safe_max).exp2_()  # (N, tq*G, tk), in place of the scores
            alpha = (row_max - safe_max).exp2_()  # rescales what was accumulated under old m
            row_sum.mul_(alpha).add_(p_ij.sum(dim=-1, keepdim=True))
            acc.mul_(alpha).baddbmm_(p_ij, v[:, j0:j1])  # (N, tq*G, Dv)
            row_max = new_max
        # Rows that may attend to nothing have l = 0 (and O = 0): output 0, and L = +inf so
        # that the backward's P = exp(S - L) is 0 for them.
        alive = row_sum > 0
        out[:, i0:i1].view(n, rows, dv).copy_(acc.div_(row_sum.masked_fill(~alive, 1.0)))
        lse[:, i0:i1].view(n, rows, 1).copy_(
            torch.where(
                alive, (row_max + row_sum.log2()) * LN2, torch.full_like(row_sum, math.inf)
            )  # back to nats
        )
    return out, lse


def _backward(
    d_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    masks: _TileMasks,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Algorithm 2.  Shapes as in ``_forward``; returns dq, dk, dv."""
    n, d = q.shape[0], q.shape[-1]
    dv_size = v.shape[-1]
    tiling = masks.tiling
    d_out = d_out.contiguous()
    delta = (d_out * out).sum(dim=-1)  # D = rowsum(dO ∘ O): (N, T, G)
    q_scaled = q * (scale * LOG2E)  # (N, T, G, D): base-2 scores, as in the forward
    lse2 = lse * LOG2E
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)  # contiguous, whatever q is
    dk = torch.zeros(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    for j0, j1 in tiling.key_tiles():
        k_j, v_j = k[:, j0:j1], v[:, j0:j1]  # (N, tk, D), (N, tk, Dv)
        k_jt, v_jt = k_j.transpose(1, 2), v_j.transpose(1, 2)
        dk_j, dv_j = dk[:, j0:j1], dv[:, j0:j1]  # views: accumulated in place
        for i0, i1 in tiling.queries_seeing(j0, j1):
            q_i = q_scaled[:, i0:i1].reshape(n, -1, d)  # (N, tq*G, D)
            rows = q_i.shape[1]
            do_i = d_out[:, i0:i1].reshape(n, rows, dv_size)  # (N, tq*G, Dv)
            s_ij = torch.bmm(q_i, k_jt)  # (N, tq*G, tk)
            masks.apply(s_ij, i0, i1, j0, j1, LOG2E)
            p_ij = s_ij.sub_(lse2[:, i0:i1].reshape(n, rows, 1)).exp2_()  # P = exp(S - L)
            dv_j.baddbmm_(p_ij.transpose(1, 2), do_i)  # dV_j += P^T dO_i
            dp_ij = torch.bmm(do_i, v_jt)  # dP = dO_i V_j^T: (N, tq*G, tk)
            ds_ij = dp_ij.sub_(delta[:, i0:i1].reshape(n, rows, 1)).mul_(p_ij)  # P ∘ (dP - D)
            dq[:, i0:i1].view(n, rows, d).baddbmm_(ds_ij, k_j, alpha=scale)  # dQ_i += dS K_j
            dk_j.baddbmm_(ds_ij.transpose(1, 2), q_i, alpha=LN2)  # dK_j += dS^T Q_i · scale
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        masks: _TileMasks,
        scale: float,
    ) -> Tensor:
        out, lse = _forward(q, k, v, masks, scale)
        ctx.save_for_backward(q, k, v, out, lse)  # O(T + S) memory: no (T, S) tensor
        ctx.masks, ctx.scale = masks, scale  # type: ignore[attr-defined]
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(d_out, q, k, v, out, lse, ctx.masks, ctx.scale)
        return dq, dk, dv, None, None  # no gradient for the masks or the scale


def _prepare_mask(mask: Tensor, rank: int, batch: tuple[int, ...], h: int, h_kv: int) -> Tensor:
    """A mask broadcastable to (*batch, H, T, S) -> (b', h_kv', T', G', S'), True = hidden.

    Only views, except that a bool mask is inverted once (the user's size, not T·S) and that
    leading batch dims are merged.
    """
    mask = mask.reshape((1,) * (max(rank, 4) - mask.dim()) + tuple(mask.shape))
    if mask.dim() > 4:  # several batch dims: merge them (copies only the mask's own size)
        if math.prod(mask.shape[:-3]) == 1:
            mask = mask.reshape(1, *mask.shape[-3:])
        else:
            mask = mask.expand(*batch, *mask.shape[-3:]).reshape(-1, *mask.shape[-3:])
    if mask.dtype == torch.bool:
        mask = ~mask
    if mask.shape[1] == 1:
        return mask.unsqueeze(3)  # (b', 1, T', 1, S')
    return mask.unflatten(1, (h_kv, h // h_kv)).transpose(2, 3)  # (b', H_kv, T', G, S')


def flash_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
) -> Tensor:
    """softmax(q k^T · scale + mask) v by FlashAttention; differentiable.

    Args:
        q: (T, D), (H, T, D) or (..., H, T, D) queries; k, v: the same rank, (..., H_kv, S, D)
            and (..., H_kv, S, Dv), with H a multiple of H_kv.
        mask: boolean (True = may attend) or additive float mask broadcastable to (..., T, S);
            it receives no gradient.
        is_causal: causal mask, aligned bottom-right.  window: causal sliding window.
        scale: score scale; None for 1/sqrt(D).
        block_q / block_k: tile sizes (query rows, keys); default ``BLOCK_Q`` /
            ``BLOCK_K``.  With grouped-query attention a query tile holds
            block_q // G positions of each of the G heads that share a key/value head.

    Returns:
        (..., H, T, Dv) output, the shape of ``q`` with D replaced by Dv.

    Prefer ``aiayn.scaled_dot_product_attention(..., backend="flash")``, which validates.
    """
    rank = q.dim()
    if rank < 2 or k.dim() != rank or v.dim() != rank:
        raise UserError(f"q, k, v need equal rank >= 2, got {q.dim()}, {k.dim()}, {v.dim()}")
    dtype = q.dtype
    # Half precision accumulates in fp32 (as the paper's kernels do on chip).
    work = torch.promote_types(dtype, torch.float32)
    q, k, v = q.to(work), k.to(work), v.to(work)
    if rank < 4:  # (T, D) or (H, T, D) -> (1, H, T, D)
        q, k, v = (x.reshape((1,) * (4 - rank) + tuple(x.shape)) for x in (q, k, v))
    batch = q.shape[:-3]
    h, t, d = q.shape[-3:]
    h_kv, s, dv = k.shape[-3], k.shape[-2], v.shape[-1]
    if h % h_kv:
        raise UserError(f"query heads ({h}) must be a multiple of key/value heads ({h_kv})")
    g, b = h // h_kv, math.prod(batch)
    # Queries of the G heads sharing a kv head become rows of one tile: (N, T, G, D).
    q_rows = q.reshape(b, h_kv, g, t, d).transpose(2, 3).reshape(b * h_kv, t, g, d).contiguous()
    k_n = k.reshape(b * h_kv, s, d).contiguous()  # (N, S, D)
    v_n = v.reshape(b * h_kv, s, dv).contiguous()  # (N, S, Dv)

    user: Tensor | None = None
    if mask is not None:
        if mask.dtype != torch.bool:
            mask = mask.to(work)
        user = _prepare_mask(mask, rank, tuple(batch), h, h_kv)
    block_q = BLOCK_Q if block_q is None else block_q
    block_k = BLOCK_K if block_k is None else block_k
    tiling = _Tiling(
        t,
        s,
        is_causal=is_causal,
        window=window,
        block_q=max(1, block_q // g),
        block_k=block_k,
        device=q.device,
    )
    masks = _TileMasks(tiling, user, b, h_kv, g)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = _FlashAttention.apply(q_rows, k_n, v_n, masks, scale)  # (N, T, G, Dv)
    out = out.reshape(b, h_kv, t, g, dv).transpose(2, 3).reshape(*batch, h, t, dv)
    if rank < 4:
        out = out.reshape(out.shape[4 - rank :])
    return out.to(dtype)


def flash_backend(
    q: Tensor, k: Tensor, v: Tensor, call: AttentionCall
) -> tuple[Tensor, Tensor | None]:
    """The ``"flash"`` backend of ``aiayn.nn.attention.scaled_dot_product_attention``."""
    if call.dropout_p != 0:
        raise UserError(
            "backend='flash' does not support attention dropout; use 'sdpa' or 'reference'"
        )
    if call.return_weights:
        raise UserError(
            "backend='flash' never materialises attention weights; use backend='reference'"
        )
    out = flash_attention(
        q, k, v, call.mask, is_causal=call.causal, window=call.window, scale=call.scale
    )
    return out, None
