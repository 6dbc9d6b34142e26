"""Scaled dot-product attention, Eq. (1) of §3.2.1:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

One entry point, and several backends chosen by name (aiayn/registry.py):

* ``"reference"`` -- the equation written out.  It materialises the (T, S) weights, so it can
  return them (for pictures and tests), and costs O(T·S) memory.
* ``"sdpa"`` -- ``torch.nn.functional.scaled_dot_product_attention`` (fused kernels, never
  returns weights); when training on a CPU at short lengths, the three matmuls of
  aiayn/nn/matmul_attention.py with their own backward, which are faster there.
* ``"flash"`` -- the tiled kernel of aiayn/nn/flash.py (O(n) memory, its own backward).

Every backend has one signature, ``Backend``: ``backend(q, k, v, call)``, where the
``AttentionCall`` carries everything besides the tensors attended over -- the mask,
causality, the sliding window, the scale, the dropout and whether to return the weights.
They agree to 1e-5 in fp32 (tests/nn/test_attention.py).  ``scaled_dot_product_attention``
is the public entry point: it checks its arguments and names what is wrong.  ``attend`` is
the same computation without the checks, for the model's own modules, whose shapes are right
by construction -- a decoding step calls it once per layer and token.  Shapes: ``(..., T, D)`` queries,
``(..., S, D)`` keys and values; with a head axis, ``(B, H, T, D)`` queries may face
``(B, H_kv, S, D)`` keys when H is a multiple of H_kv (grouped-query attention, Ainslie et
al., 2023).  Masks follow PyTorch: a boolean mask is True where attention is allowed; a float
mask is added to the scores.  ``is_causal`` aligns the triangle bottom-right (the T queries are
the last T of the S positions), which is what cached decoding needs.

A query that may attend to nothing (a padding query, or a window that excludes every key)
gets an all-zero output and zero gradients -- never NaN -- in every backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn import registry
from aiayn.errors import UserError
from aiayn.nn.masks import structural_mask
from aiayn.nn.matmul_attention import matmul_attention, max_scores

ScaleArg = bool | float


@dataclass(slots=True, eq=False, kw_only=True)
class AttentionCall:
    """What one evaluation of Eq. (1) attends with, besides the queries, keys and values.

    Made once per attention module per forward pass (so with slots, not frozen: a frozen
    dataclass costs twice as much to build, per decoding step and layer); never changed once
    made."""

    scale: float  # multiplies q k^T: 1/sqrt(d_k) in the paper (§3.2.1), 1.0 in the ablation
    mask: Tensor | None = None  # bool (True = may attend) or additive float, to (..., T, S)
    causal: bool = False  # bottom-right aligned: query i sits at position S - T + i
    window: int | None = None  # causal sliding window: a query sees its last `window` keys
    dropout_p: float = 0.0  # on the attention weights; 0 in evaluation
    return_weights: bool = False  # also return the (..., T, S) weights (reference backend)
    # Ragged rows of a decoding step: ((a, b, keys), ...) -- rows a .. b-1 read only their
    # first `keys` keys (the mask still says which of those each row may see).  Rows of
    # different lengths then cost what they hold, not the longest row's length each
    # (aiayn/serve/slots.py groups a serving pool's rows so).  None: every row reads all keys.
    row_groups: tuple[tuple[int, int, int], ...] | None = None
    # Every query sees at least one key (a serving pool's decoding step: each row sees its own
    # keys), so a backend need not look for fully masked rows to zero.
    live_rows: bool = False

    def for_lengths(self, t: int, s: int) -> AttentionCall:
        """This call for T queries and S keys.  One query at the newest position (a decoding
        step) that may see every key given has no causal or window constraint: the call
        without them, so that no mask is built."""
        if t != 1 or not (self.causal or self.window is not None):
            return self
        if self.window is not None and s > self.window:
            return self
        return AttentionCall(
            scale=self.scale,
            mask=self.mask,
            dropout_p=self.dropout_p,
            return_weights=self.return_weights,
            row_groups=self.row_groups,
        )

    def for_rows(self, a: int, b: int, keys: int) -> AttentionCall:
        """This call for rows a .. b-1 and their first ``keys`` keys (a ragged group of a
        decoding step, whose every row sees at least its own key)."""
        mask = self.mask
        if mask is not None and mask.dim() >= 3 and mask.shape[0] > 1:
            mask = mask[a:b, ..., :keys]
        elif mask is not None:
            mask = mask[..., :keys]
        return AttentionCall(
            scale=self.scale,
            mask=mask,
            causal=self.causal,
            window=self.window,
            dropout_p=self.dropout_p,
            live_rows=True,
        )


class Backend(Protocol):
    """An implementation of Eq. (1): (..., T, D) queries and (..., S, D) keys and values (a
    query head axis may be a multiple of the key one) -> the (..., T, D) output, and the
    (..., T, S) weights when ``call.return_weights``, else None."""

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, call: AttentionCall
    ) -> tuple[Tensor, Tensor | None]: ...


def masked_softmax(
    scores: Tensor, mask: Tensor | None, *, is_causal: bool, window: int | None
) -> Tensor:
    """softmax over the last axis of (..., T, S) ``scores`` after the structural (causal,
    window) and explicit masks; a row with no allowed key gets all-zero weights, not NaN."""
    t, s = scores.shape[-2], scores.shape[-1]
    masked = False
    structural = structural_mask(t, s, is_causal, window, scores.device)
    if structural is not None:
        scores = scores.masked_fill(~structural, float("-inf"))
        masked = True
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
        masked = True
    # At least fp32 (bf16/fp16 scores are summed in fp32); fp64 stays fp64.
    exact = torch.promote_types(scores.dtype, torch.float32)
    if not masked:
        return torch.softmax(scores, dim=-1, dtype=exact).to(scores.dtype)
    # Rows with no allowed key would be softmax(-inf, ..., -inf) = NaN: make them zeros.
    dead = scores.amax(dim=-1, keepdim=True) == float("-inf")  # (..., T, 1)
    scores = scores.masked_fill(dead, 0.0)
    weights = torch.softmax(scores, dim=-1, dtype=exact).to(scores.dtype)
    return weights.masked_fill(dead, 0.0)


def reference_backend(
    q: Tensor, k: Tensor, v: Tensor, call: AttentionCall
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T · scale + mask) V, written out (Eq. 1)."""
    mask = call.mask
    groups = q.shape[-3] // k.shape[-3] if q.dim() >= 3 else 1
    if groups > 1:  # GQA: (B, H, T, D) -> (B, H_kv, G, T, D); keys gain a broadcast G axis
        q = q.unflatten(-3, (k.shape[-3], groups))
        k, v = k.unsqueeze(-3), v.unsqueeze(-3)
        if mask is not None:
            if mask.dim() >= 3 and mask.shape[-3] != 1:
                mask = mask.unflatten(-3, (k.shape[-4], groups))
            elif mask.dim() >= 3:
                mask = mask.unsqueeze(-3)
            # a (T, S) or (S,) mask broadcasts against (B, H_kv, G, T, S) as it is
    scores = torch.matmul(q, k.transpose(-2, -1)) * call.scale  # (..., T, S)
    weights = masked_softmax(scores, mask, is_causal=call.causal, window=call.window)
    p = call.dropout_p
    mixed = F.dropout(weights, p=p) if p > 0 else weights
    out = torch.matmul(mixed, v)  # (..., T, D)
    if groups > 1:
        out = out.flatten(-4, -3)  # (B, H, T, D)
        weights = weights.flatten(-4, -3)  # (B, H, T, S)
    return out, (weights if call.return_weights else None)


def _matmul_attention_applies(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> bool:
    """Training on a CPU at most ``max_scores`` scores per head: aiayn/nn/matmul_attention.py is
    faster there than PyTorch's fused kernel (its docstring has the timings).  Inference keeps
    the fused kernel, which saves nothing for a backward."""
    t, s = q.shape[-2], k.shape[-2]
    return (
        q.device.type == "cpu"
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
        and q.dtype == k.dtype == v.dtype
        and q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
        and t * s <= max_scores(q.dtype)
        and (not is_causal or t == s)
    )


CAPTURED_SCORES = 8192  # queries x keys per head up to which a decoding step writes Eq. (1) out
DECODING_QUERIES = 8  # queries per head of a decoding step: one token, or one per beam


def _written_out(q: Tensor, k: Tensor, t: int, s: int) -> bool:
    """Whether a step of ``t`` queries over ``s`` keys per head writes Eq. (1) out (two
    products around a softmax) rather than calling PyTorch's fused kernel: a captured
    decoding step (inductor fuses the mask and the softmax into one loop between the
    products), and an eager decoding step on a CPU, where the fused kernel, built for many
    queries, took 2-4x as long at Marian-small's batch of 64 beams (docs/performance.md,
    "A captured decoding step"), in fp32.  Eager and captured steps then compute the same
    formula, at every batch size."""
    if t * s > CAPTURED_SCORES:
        return False
    if torch.compiler.is_compiling():
        return True
    return (
        q.device.type == "cpu"
        and t <= DECODING_QUERIES
        and not torch.is_grad_enabled()
        and q.dtype == k.dtype == torch.float32  # bf16 scores would be rounded to bf16
    )


def sdpa_backend(
    q: Tensor, k: Tensor, v: Tensor, call: AttentionCall
) -> tuple[Tensor, Tensor | None]:
    """PyTorch's fused scaled_dot_product_attention, with fully masked rows made zero."""
    if call.return_weights:
        raise UserError("backend='sdpa' cannot return attention weights; use backend='reference'")
    mask, window, scale, dropout_p = call.mask, call.window, call.scale, call.dropout_p
    is_causal = call.causal
    t, s = q.shape[-2], k.shape[-2]
    if _written_out(q, k, t, s):
        return reference_backend(q, k, v, call)
    enable_gqa = q.dim() >= 3 and q.shape[-3] != k.shape[-3]
    if (
        mask is None
        and window is None
        and dropout_p == 0.0
        and not enable_gqa
        and _matmul_attention_applies(q, k, v, is_causal)
    ):
        return matmul_attention(q, k, v, is_causal=is_causal, scale=scale), None
    if mask is None and window is None and (not is_causal or t == s):
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, scale=scale, dropout_p=dropout_p, enable_gqa=enable_gqa
        )
        return out, None
    structural = structural_mask(t, s, is_causal, window, q.device)
    if mask is not None and mask.dim() == 1:
        mask = mask[None]  # (S,) -> (1, S): PyTorch's kernel wants the query axis
    if mask is None:
        attn = structural
    elif mask.dtype == torch.bool:
        attn = mask if structural is None else mask & structural
    else:
        attn = mask if structural is None else mask.masked_fill(~structural, float("-inf"))
    assert attn is not None
    dead = None  # (..., T, 1): rows that may see no key; none in a pool's decoding step
    if not call.live_rows and attn.dtype == torch.bool:
        dead = ~attn.any(dim=-1, keepdim=True)
        attn = attn | dead  # let dead rows attend anywhere; their output is zeroed below
    elif not call.live_rows:
        dead = (attn == float("-inf")).all(dim=-1, keepdim=True)
        attn = attn.masked_fill(dead, 0.0)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn, scale=scale, dropout_p=dropout_p, enable_gqa=enable_gqa
    )
    return (out if dead is None else out.masked_fill(dead, 0.0)), None


def backend(name: str) -> Backend:
    """The backend registered as ``name``."""
    fn: Backend = registry.resolve("attention_backend", name)
    return fn


def attention_scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """The raw scores ``q k^T · scale`` of Eq. (1) for every query-key pair, before any mask:
    (B, H, T, D) queries against (B, H_kv, S, D) keys -> (B, H, T, S)."""
    groups = q.shape[-3] // k.shape[-3] if q.dim() >= 3 else 1
    keys = k.repeat_interleave(groups, dim=-3) if groups > 1 else k  # (B, H, S, D)
    return torch.matmul(q, keys.transpose(-2, -1)) * scale


def attend(
    q: Tensor, k: Tensor, v: Tensor, call: AttentionCall, backend_name: str = "sdpa"
) -> tuple[Tensor, Tensor | None]:
    """Eq. (1) by the named backend, without argument checks (see the module docstring).
    A decoding step with ``call.row_groups`` attends group by group, each group over its own
    keys only."""
    call = call.for_lengths(q.shape[-2], k.shape[-2])
    fn = backend(backend_name)
    groups = call.row_groups
    if groups is None or call.return_weights or q.shape[-2] != 1:
        return fn(q, k, v, call)
    out = [
        fn(q[a:b], k[a:b, ..., :n, :], v[a:b, ..., :n, :], call.for_rows(a, b, n))[0]
        for a, b, n in groups
    ]
    return (out[0] if len(out) == 1 else torch.cat(out)), None  # (B, H, 1, D)


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> None:
    """Raise UserError naming the first of q, k, v and mask whose type or shape is wrong."""
    _check_qkv(q, k, v)
    if mask is not None:
        _check_mask(mask, q, k)


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise UserError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise UserError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() < 2:
            raise UserError(f"{name} must have shape (..., T, D), got {tuple(x.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise UserError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.dim() == k.dim() == v.dim()):
        raise UserError(
            f"q, k, v must have the same rank, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise UserError(f"q and k must share the last dim, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[:-1] != v.shape[:-1]:
        raise UserError(
            f"k and v must match except in the last dim, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if q.dim() >= 3 and q.shape[-3] % k.shape[-3]:
        raise UserError(
            f"query heads ({q.shape[-3]}) must be a multiple of key/value heads ({k.shape[-3]})"
        )
    if q.shape[:-3] != k.shape[:-3]:
        raise UserError(
            f"q and k batch dims differ: {tuple(q.shape[:-3])} vs {tuple(k.shape[:-3])}"
        )


def _check_mask(mask: Tensor, q: Tensor, k: Tensor) -> None:
    if not isinstance(mask, Tensor):
        raise UserError(f"mask must be a tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and mask.dtype != q.dtype:
        raise UserError(f"mask must be bool or {q.dtype} (additive), got {mask.dtype}")
    target = (*q.shape[:-1], k.shape[-2])
    try:
        if torch.broadcast_shapes(mask.shape, target) != target:
            raise RuntimeError
    except RuntimeError:
        raise UserError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to scores {target}"
        ) from None


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    window: int | None = None,
    scale: ScaleArg = True,
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: str = "reference",
) -> Tensor | tuple[Tensor, Tensor]:
    """Eq. (1): ``softmax(q k^T · scale + mask) v``.

    Args:
        q: (..., T, D) queries; k, v: (..., S, D) keys and values.  With a head axis, q may
            have a multiple of k's heads (grouped-query / multi-query attention).
        mask: boolean (True = may attend) or additive float mask broadcastable to (..., T, S).
        is_causal: add the causal mask (bottom-right aligned: query i is at position S-T+i).
        window: causal sliding window -- a query sees only the last ``window`` keys (itself
            included).  Implies ``is_causal``.
        scale: True for 1/sqrt(D) (the paper), False for no scaling (the ablation §3.2.1
            argues against), or an explicit float.
        dropout_p: dropout on the attention weights (pass 0 in evaluation).
        return_weights: also return the (..., T, S) weights (reference backend only).
        backend: a name registered in aiayn/registry.py (``attention_backend``).

    Returns:
        (..., T, D) output, or ``(output, weights)`` when ``return_weights``.
    """
    names = registry.names("attention_backend")
    if backend not in names:
        raise UserError(f"unknown attention backend {backend!r}; expected one of {sorted(names)}")
    _check_inputs(q, k, v, mask)
    if window is not None and window < 1:
        raise UserError(f"window must be a positive integer or None, got {window}")
    if (is_causal or window is not None) and q.shape[-2] > k.shape[-2]:
        raise UserError(
            f"causal attention needs at least as many keys as queries, got T={q.shape[-2]}, S={k.shape[-2]}"
        )
    if not 0.0 <= dropout_p < 1.0:
        raise UserError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if isinstance(scale, bool):
        scale_value = 1.0 / math.sqrt(q.shape[-1]) if scale else 1.0
    else:
        scale_value = float(scale)
    call = AttentionCall(
        scale=scale_value,
        mask=mask,
        causal=is_causal,
        window=window,
        dropout_p=dropout_p,
        return_weights=return_weights,
    )
    out, weights = attend(q, k, v, call, backend)
    if return_weights:
        assert weights is not None
        return out, weights
    return out
