"""Eq. (1) as three batched matmuls with a hand-written backward: the training kernel for
short sequences on a CPU.

    S = Q K^T · scale (+ the causal -inf above the diagonal)      (B·H, T, S)
    P = softmax(S)                                                 (B·H, T, S)
    O = P V                                                        (B·H, T, D)

and, given dO, the gradients (∘ is the elementwise product; dS is the softmax's backward):

    dV = P^T dO        dP = dO V^T        dS = P ∘ (dP - rowsum(P ∘ dP))
    dQ = dS K · scale  dK = dS^T Q · scale

PyTorch's fused CPU attention (the flash-attention algorithm) tiles the sequence and never
forms P, which is what long sequences need; at the lengths language models train at on a
CPU its tiling costs more than the O(T·S) memory it saves (``benchmarks/attention.py``
measures both; docs/performance.md, "The measurements behind the kernels").  The autograd graph of the
written-out equation (aiayn.nn.attention.reference_backend) is slower still: it builds the
mask, upcasts and keeps more intermediates.

The five matmuls run in the inputs' dtype; in bf16 the scores are rounded to bf16 before the
softmax, as every written-out attention under autocast does, and the softmax itself sums in
fp32.  Its cost is the saved P: B·H·T·S values per layer, so the attention backend uses it
only up to ``max_scores`` scores per head (aiayn.nn.attention.sdpa_backend).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from aiayn.errors import UserError

# Scores per head (T·S) up to which training on a CPU takes this kernel.  In bf16 it won at
# every length measured, in a whole language-model step too; 512 x 512 keeps the saved weights
# of a (8, 6)-head batch at 25 MB per layer.  In fp32 it won the step at context 64 but lost
# it at 256 (the saved fp32 weights, 12.6 MB a layer, crowd the caches), though alone it was
# faster there: hence the smaller fp32 limit (docs/performance.md, "The measurements behind the kernels").
MAX_SCORES_LOW_PRECISION = 512 * 512
MAX_SCORES_FP32 = 128 * 128


def max_scores(dtype: torch.dtype) -> int:
    """Scores per head up to which training on a CPU takes this kernel, for ``dtype``."""
    return MAX_SCORES_LOW_PRECISION if dtype in (torch.bfloat16, torch.float16) else MAX_SCORES_FP32


_causal_bias: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}


def causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(n, n): 0 on and below the diagonal, -inf above it (made once per size and dtype)."""
    if torch.compiler.is_compiling():  # a graph torch.compile traces writes no cache
        return torch.full((n, n), float("-inf"), device=device).triu(1).to(dtype)
    key = (n, dtype, device)
    if key not in _causal_bias:
        _causal_bias[key] = torch.full((n, n), float("-inf"), device=device).triu(1).to(dtype)
    return _causal_bias[key]


class MatmulAttention(torch.autograd.Function):
    """softmax(Q K^T · scale + bias) V over (..., T, D) inputs, with the backward written out
    above (saves Q, K, V and P).  ``bias`` is ``causal_bias`` (T, T), or None."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float
    ) -> Tensor:
        t = q.shape[-2]
        q3, k3, v3 = (x.reshape(-1, x.shape[-2], x.shape[-1]) for x in (q, k, v))  # (B·H, ., D)
        kt = k3.transpose(1, 2)  # (B·H, D, S)
        if bias is not None:  # (T, T): the causal -inf above the diagonal
            scores = torch.baddbmm(bias, q3, kt, alpha=scale)
        else:
            scores = torch.bmm(q3, kt).mul_(scale)  # (B·H, T, S)
        p = torch.softmax(scores, dim=-1)  # (B·H, T, S)
        del scores
        o = torch.bmm(p, v3)  # (B·H, T, D)
        ctx.save_for_backward(q3, k3, v3, p)
        ctx.scale, ctx.shapes = scale, (q.shape, k.shape, v.shape)
        return o.view(*q.shape[:-2], t, v.shape[-1])

    @staticmethod
    def backward(ctx: Any, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q3, k3, v3, p = ctx.saved_tensors
        q_shape, k_shape, v_shape = ctx.shapes
        do = d_out.reshape(q3.shape[0], q3.shape[1], v3.shape[2])  # (B·H, T, D)
        dv = torch.bmm(p.transpose(1, 2), do)  # (B·H, S, D)
        dp = torch.bmm(do, v3.transpose(1, 2))  # (B·H, T, S)
        # P ∘ (dP - rowsum(P ∘ dP)) in one pass, summed in fp32 for bf16 inputs: PyTorch's own
        # softmax backward kernel (what autograd runs for torch.softmax).
        ds = torch._softmax_backward_data(dp, p, -1, p.dtype)  # (B·H, T, S)
        dq = torch.bmm(ds, k3).mul_(ctx.scale)  # (B·H, T, D)
        dk = torch.bmm(ds.transpose(1, 2), q3).mul_(ctx.scale)  # (B·H, S, D)
        return dq.view(q_shape), dk.view(k_shape), dv.view(v_shape), None, None


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, *, is_causal: bool, scale: float) -> Tensor:
    """softmax(Q K^T · scale) V for (..., T, D) queries and (..., S, D) keys and values of one
    dtype, the same leading axes (no grouped-query broadcast), no mask beyond the causal one
    (which needs T == S)."""
    if is_causal and q.shape[-2] != k.shape[-2]:
        raise UserError(
            f"causal matmul attention needs T == S, got {q.shape[-2]} and {k.shape[-2]}"
        )
    # The mask is made outside the Function: torch.compile cannot trace the cache's use inside.
    bias = causal_bias(q.shape[-2], q.dtype, q.device) if is_causal else None
    out: Tensor = MatmulAttention.apply(q, k, v, bias, scale)
    return out
