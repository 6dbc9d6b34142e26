"""A selective state-space layer (Mamba; Gu & Dao, 2023) in plain PyTorch, as a sequence mixer
in place of self-attention.

Per channel c of the inner width E and state size N, with input-dependent (selective) step
Δ_t, input matrix B_t and output matrix C_t::

    h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t x_t          (E × N state)
    y_t = C_t · h_t + D x_t

around it, Mamba's block: an input projection to x and a gate z (2E), a short causal
depthwise convolution and SiLU on x, the scan, ``y ⊙ SiLU(z)``, and an output projection
back to the model width.  A = -exp(A_log) < 0 makes every state decay.

* Training computes the decays exp(Δ_t A), the inputs Δ_t B_t x_t and the read-outs for all
  positions at once; only the state update h_t = decay_t ⊙ h_{t-1} + input_t runs position
  by position -- one multiply-add on a (B, E, N) tensor each, as Mamba's reference scan
  does.  (A chunked parallel form needs L × L × E × N numbers per chunk, which on a CPU
  costs far more than it saves.)
* Decoding carries (conv window, h): a fixed E × (k - 1 + N) numbers per layer, whatever the
  length -- no growing cache.

:func:`selective_scan` is both (a state in, a state out); tests/nn/test_ssm.py checks it
against the recurrence written out position by position, and the layer's step-by-step decoding
against its full-sequence pass.  A padded position (``keep`` False) has Δ = 0 and x = 0: the
state passes it unchanged.

Shapes: B batch, T positions, C = d_model, E inner width, N state size, K conv width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.nn.context import Context
from aiayn.nn.linear import Linear


@dataclass
class SSMState:
    """One layer's decoding state: the last K - 1 conv inputs (B, E, K-1) and h (B, E, N)."""

    conv: Tensor
    h: Tensor

    def reorder(self, index: Tensor) -> None:
        self.conv, self.h = self.conv.index_select(0, index), self.h.index_select(0, index)

    def nbytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.h.numel() * self.h.element_size()


def selective_scan(
    x: Tensor,
    delta: Tensor,
    a: Tensor,
    b: Tensor,
    c: Tensor,
    d: Tensor,
    h: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The scan: (B, T, E) inputs x and steps Δ, (E, N) A, (B, T, N) B and C, (E,) D, and the
    (B, E, N) state before (None = zeros).  Returns the (B, T, E) outputs and the state after.

    Everything but the state update is computed for all positions at once -- the decays
    exp(Δ_t A) and inputs Δ_t B_t x_t before the loop, the read-outs C_t · h_t after it -- so
    the loop over t is one multiply-add on the (B, E, N) state per position."""
    bsz, _, e = x.shape
    if h is None:
        h = x.new_zeros(bsz, e, a.shape[-1])
    decay = torch.exp(delta[..., None] * a)  # (B, T, E, N)
    inputs = (delta * x)[..., None] * b[:, :, None, :]  # (B, T, E, N)
    states = []
    # unbind, not decay[:, i]: indexing's backward would write a full-size zero gradient per
    # position (T x B·T·E·N); unbind's gathers them once.
    for step_decay, step_input in zip(decay.unbind(1), inputs.unbind(1), strict=True):
        h = step_decay * h + step_input
        states.append(h)
    if not states:
        return x.new_zeros(bsz, 0, e), h
    hs = torch.stack(states, 1)  # (B, T, E, N)
    return (hs * c[:, :, None, :]).sum(-1) + d * x, h


def selective_scan_reference(
    x: Tensor, delta: Tensor, a: Tensor, b: Tensor, c: Tensor, d: Tensor
) -> Tensor:
    """The recurrence one position at a time, for tests."""
    h = x.new_zeros(x.shape[0], x.shape[2], a.shape[-1])
    ys = []
    for t in range(x.shape[1]):
        h = (
            torch.exp(delta[:, t, :, None] * a) * h
            + (delta[:, t] * x[:, t])[..., None] * b[:, t, None, :]
        )
        ys.append((h * c[:, t, None, :]).sum(-1) + d * x[:, t])
    return torch.stack(ys, 1)


class SelectiveSSM(nn.Module):
    """Mamba's mixer (module docstring): (B, T, C) -> (B, T, C), causal, with a state for
    decoding.  ``expand`` sets E = expand · C; ``state_size`` is N; ``conv`` is K."""

    def __init__(
        self,
        d_model: int,
        *,
        state_size: int = 16,
        expand: int = 2,
        conv: int = 4,
        bias: bool = False,
        layer: int = 0,
    ) -> None:
        super().__init__()
        e = expand * d_model
        self.inner, self.state_size, self.kernel, self.layer = e, state_size, conv, layer
        self.dt_rank = math.ceil(d_model / 16)
        self.in_proj = Linear(d_model, 2 * e, bias=bias)  # x and the gate z
        self.conv = nn.Conv1d(e, e, conv, groups=e, padding=0, bias=True)  # causal: left pad
        self.x_proj = Linear(e, self.dt_rank + 2 * state_size, bias=False)  # Δ (low rank), B, C
        self.dt_proj = Linear(self.dt_rank, e, bias=True)
        self.a_log = nn.Parameter(torch.empty(e, state_size))  # (E, N): A = -exp(a_log)
        self.d = nn.Parameter(torch.empty(e))
        self.out = Linear(e, d_model, bias=bias)
        self.post_init()

    @torch.no_grad()
    def post_init(self) -> None:
        """Mamba's own initialisation, which the model's generic one (matrices and zero
        biases) must not undo: Δ's bias such that softplus gives steps in [1e-3, 0.1],
        log-uniform; A_n = -(n + 1) for n < N (S4D-real); D = 1."""
        dt = torch.exp(torch.rand(self.inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        n = torch.arange(1, self.state_size + 1, dtype=torch.float32)
        self.a_log.copy_(torch.log(n).repeat(self.inner, 1))
        self.d.fill_(1.0)

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        if not ctx.causal:
            raise ValueError("the selective state-space layer is causal (decoder-only models)")
        keep = ctx.new_token_keep(x.shape[1])  # (B, T) or None
        xz = self.in_proj(x)  # (B, T, 2E)
        u, z = xz.chunk(2, dim=-1)  # (B, T, E) each
        if keep is not None:
            u = u * keep[..., None].to(u.dtype)
        layer = None if ctx.cache is None else ctx.cache.layers[self.layer]
        state = layer.state if layer is not None and isinstance(layer.state, SSMState) else None
        k = self.kernel
        history = (
            state.conv if state is not None else u.new_zeros(u.shape[0], self.inner, k - 1)
        )  # (B, E, K-1)
        window = torch.cat([history, u.transpose(1, 2)], dim=-1)  # (B, E, K-1+T)
        u = F.silu(self.conv(window).transpose(1, 2))  # (B, T, E)
        dt, b, c = self.x_proj(u).split([self.dt_rank, self.state_size, self.state_size], dim=-1)
        delta = F.softplus(self.dt_proj(dt))  # (B, T, E)
        if keep is not None:
            delta = delta * keep[..., None].to(delta.dtype)  # padding: no step, no input
            u = u * keep[..., None].to(u.dtype)
        a = -torch.exp(self.a_log.float())  # (E, N)
        y, h = selective_scan(
            u.float(), delta.float(), a, b.float(), c.float(), self.d.float(),
            None if state is None else state.h,
        )  # fmt: skip
        if layer is not None:
            layer.state = SSMState(window[..., -(k - 1) :].detach(), h.detach())
        y = y.to(x.dtype) * F.silu(z)
        return self.out(y)
