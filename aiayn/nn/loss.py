"""Cross entropy over the vocabulary, fused with the output projection and computed in chunks.

The last layer of every model maps each position's vector to V logits, and the loss is the
(label-smoothed, §5.4) cross entropy of their softmax.  Written as ``F.cross_entropy(h Wᵀ)``
this materialises (N, V) logits, their log-softmax and their gradient: three N·V tensors,
which for a 4,096-token batch over an 8,000-token vocabulary are 131 MB each, more than all
of a small model's other activations together.

``linear_cross_entropy`` walks the rows in chunks.  For each chunk it forms the logits,
the loss and -- when gradients are wanted -- the gradient with respect to the logits, which
it immediately turns into the gradients of ``h`` (N, C) and of ``W`` (V, C); the chunk's
logits are then dropped.  Peak extra memory is one chunk's logits instead of three full
copies, and the arithmetic is the same three matrix products as the unfused path (forward,
dh, dW).  Gradients are computed in the forward pass (as Liger-Kernel's fused linear cross
entropy does) and scaled by the incoming gradient in the backward pass: the loss is a scalar.

With label smoothing ε over V classes the target distribution is (1 - ε) on the reference
token plus ε / V on every token (the definition ``torch.nn.functional.cross_entropy`` uses),
so per row::

    loss = logsumexp(z) - (1 - ε) z_y - ε · mean(z)
    ∂loss/∂z = softmax(z) - (1 - ε) onehot(y) - ε / V

Rows whose target is ``ignore_index`` contribute nothing; the mean is over the other rows.
tests/nn/test_loss.py checks values and gradients against ``F.cross_entropy(F.linear(h, W))``.

Shapes: N rows (positions), C = d_model, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aiayn.errors import UserError

CHUNK_ROWS = 1024  # rows per chunk: (1024, V) fp32 logits at a time


def _chunk_loss(
    h: Tensor, weight: Tensor, bias: Tensor | None, y: Tensor, ignore: int, smoothing: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Summed loss of the chunk's valid rows; its (n, V) fp32 log-probabilities, the (n,)
    valid flags and the (n,) targets with ignored ones replaced by 0."""
    z = F.linear(h, weight, bias)  # (n, V)
    if z.dtype in (torch.bfloat16, torch.float16):
        z = z.float()  # the softmax in fp32, whatever the matmul ran in
    logp = torch.log_softmax(z, dim=-1)  # (n, V), one fused pass
    del z
    valid = y != ignore  # (n,)
    safe_y = torch.where(valid, y, 0)
    per_row = -(1.0 - smoothing) * logp.gather(1, safe_y[:, None]).squeeze(1)  # (n,)
    if smoothing:
        per_row = per_row - smoothing * logp.mean(dim=-1)
    return (per_row * valid).sum(), logp, valid, safe_y


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        h: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        y: Tensor,
        ignore: int,
        smoothing: float,
        chunk: int,
    ) -> Tensor:
        n_valid = int((y != ignore).sum())
        denom = max(n_valid, 1)
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        dh = torch.empty_like(h) if need_h else None  # (N, C)
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32
        dw = torch.zeros(weight.shape, dtype=acc, device=h.device) if need_w else None
        db = torch.zeros(weight.shape[0], dtype=acc, device=h.device) if need_b else None
        total = torch.zeros((), dtype=acc, device=h.device)
        w = weight.to(h.dtype)
        eps_v = smoothing / weight.shape[0]  # the ε / V every class gets
        w_sum = w.sum(0) if smoothing and need_h else None  # (C,), for the ε / V term
        h_sum = torch.zeros(h.shape[-1], dtype=acc, device=h.device)  # Σ r·h, likewise
        for start in range(0, h.shape[0], chunk):
            hc, yc = h[start : start + chunk], y[start : start + chunk]
            loss, logp, valid, safe_y = _chunk_loss(hc, weight, bias, yc, ignore, smoothing)
            total += loss
            if dh is None and dw is None and db is None:
                continue
            # dz = r ⊙ (softmax(z) - (1 - ε) onehot(y) - ε / V), r = valid / n_valid per row.
            # The row scale r and the constant ε / V are applied to the (n, C) and (V, C)
            # products rather than to the (n, V) probabilities: two passes over (n, V) saved.
            g = logp.exp_()  # (n, V) softmax, in the log-probabilities' memory
            g.scatter_add_(
                1,
                safe_y[:, None],
                torch.full((yc.shape[0], 1), smoothing - 1.0, dtype=g.dtype, device=g.device),
            )
            r = (valid.to(acc) / denom)[:, None]  # (n, 1)
            gl = g.to(h.dtype)
            if dh is not None:
                dhc = gl @ w  # (n, C)
                if w_sum is not None:
                    dhc -= eps_v * w_sum
                dh[start : start + chunk] = dhc * r.to(dhc.dtype)
            if dw is not None:  # (V, C), accumulated in fp32
                hr = hc * r.to(hc.dtype)  # (n, C)
                if gl.dtype == hr.dtype == dw.dtype:
                    dw.addmm_(gl.t(), hr)
                else:
                    dw.add_(gl.t() @ hr.to(gl.dtype))
                if smoothing:
                    h_sum += hr.sum(0).to(acc)
            if db is not None:
                db += (g * r.to(g.dtype)).sum(0).to(acc) - eps_v * float(r.sum())
        if dw is not None and smoothing:
            dw -= eps_v * h_sum  # the ε / V term of every class, once
        ctx.save_for_backward(
            *(t if t is not None else torch.empty(0) for t in (dh, dw, db)),
        )
        ctx.has = (dh is not None, dw is not None, db is not None)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        return total / denom

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        dh, dw, db = ctx.saved_tensors
        has_h, has_w, has_b = ctx.has
        w_dtype, b_dtype = ctx.dtypes
        return (
            dh * grad.to(dh.dtype) if has_h else None,
            (dw * grad).to(w_dtype) if has_w else None,
            (db * grad).to(b_dtype) if has_b else None,
            None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    h: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    bias: Tensor | None = None,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
    chunk_rows: int = CHUNK_ROWS,
) -> Tensor:
    """Mean cross entropy of ``softmax(h Wᵀ + b)`` against ``targets``, without ever holding
    all (N, V) logits (see the module docstring).

    Args:
        h: (N, C) or (B, T, C) final hidden states.
        weight: (V, C) output projection (the tied embedding, §3.4).
        targets: (N,) or (B, T) token ids; ``ignore_index`` marks rows to skip (padding).
        label_smoothing: ε of §5.4, with ``F.cross_entropy``'s definition.

    Returns:
        A scalar: the mean over the rows that are not ignored (0 if there are none).
    """
    if h.shape[:-1] != targets.shape:
        raise UserError(
            f"hidden states {tuple(h.shape)} and targets {tuple(targets.shape)} disagree:"
            " expected targets shaped like the hidden states without their last dimension"
        )
    if weight.dim() != 2 or weight.shape[1] != h.shape[-1]:
        raise UserError(
            f"weight must be (V, {h.shape[-1]}) for hidden size {h.shape[-1]}, got {tuple(weight.shape)}"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise UserError(f"label_smoothing={label_smoothing} must be in [0, 1)")
    if chunk_rows < 1:
        raise UserError(f"chunk_rows={chunk_rows} must be >= 1")
    flat_h = h.reshape(-1, h.shape[-1])  # (N, C)
    flat_y = targets.reshape(-1)  # (N,)
    if flat_y.numel() and (flat_y != ignore_index).any():
        valid = flat_y[flat_y != ignore_index]
        if int(valid.min()) < 0 or int(valid.max()) >= weight.shape[0]:
            raise UserError(
                f"targets must lie in [0, {weight.shape[0]}) or equal ignore_index={ignore_index},"
                f" got values in [{int(valid.min())}, {int(valid.max())}]"
            )
    if not torch.is_grad_enabled() or not (
        flat_h.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    ):
        with torch.no_grad():
            n_valid = max(int((flat_y != ignore_index).sum()), 1)
            total = sum(
                (
                    _chunk_loss(
                        flat_h[s : s + chunk_rows],
                        weight,
                        bias,
                        flat_y[s : s + chunk_rows],
                        ignore_index,
                        label_smoothing,
                    )[0]
                    for s in range(0, flat_h.shape[0], chunk_rows)
                ),
                torch.zeros(
                    (),
                    dtype=torch.float64 if h.dtype == torch.float64 else torch.float32,
                    device=flat_h.device,
                ),
            )
            return total / n_valid
    return _LinearCrossEntropy.apply(
        flat_h, weight, bias, flat_y, ignore_index, label_smoothing, chunk_rows
    )
