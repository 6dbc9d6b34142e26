"""A selective state-space layer in plain PyTorch, as a sequence mixer in place of
self-attention: Mamba-2's (Dao & Gu, 2024, "Transformers are SSMs"), whose scan trains in
chunks of matrix products.

Per head h (E = H · P inner channels in H heads of P), state size N, with an input-dependent
(selective) step Δ_t (one per head), input vector B_t and output vector C_t (N each)::

    h_t = exp(Δ_t A_h) h_{t-1} + Δ_t x_t B_tᵀ          (P × N state per head)
    y_t = h_t C_t + D_h x_t

A_h = -exp(A_log_h) < 0, so every state decays.  This is Mamba's selective scan (Gu & Dao,
2023) with one change, Mamba-2's: the decay is a scalar per head and step, not a separate
number for each of the E × N state entries.  That is what lets the scan train as matrix
products.

Around the scan sits Mamba-2's block:

* one input projection to the gate z (E), the scan input x (E), B and C (N each) and Δ (H);
* a short causal depthwise convolution and SiLU over x, B and C;
* the scan;
* a gated RMSNorm, RMSNorm(y ⊙ SiLU(z));
* the output projection back to the model width.

Two forms compute the scan, and tests/nn/test_ssm.py checks both against the recurrence
written out position by position:

* Training (``chunked_scan``): the sequence is cut into chunks of Q positions.
  Inside a chunk, y = (L ∘ C Bᵀ) (Δ x), where L_ts = exp(Σ_{s<j≤t} Δ_j A) for s ≤ t (0 above
  the diagonal): this is the "attention-like" quadratic form on Q × Q blocks.  Each chunk's
  final state is a matrix product too.  Only the hand-over of the state from chunk to chunk,
  one multiply-add per chunk on a (B, H, P, N) tensor, runs in a loop.  Nothing of size
  T × E × N is ever built, which is what made Mamba-1's per-entry decay slow in plain
  PyTorch: its scan is memory-bound on such tensors.
* Decoding (``scan_step``): one step of the recurrence, carrying (conv window, h): a fixed
  (E + 2N) × (K - 1) + E × N numbers per layer, whatever the length.  No cache grows.

A padded position (``keep`` False) has Δ = 0 and x = 0: the state passes it unchanged.

Shapes: B batch, T positions, C = d_model, E inner width, H heads of P channels (E = H P),
N state size, K conv width, Q chunk length, G = T / Q chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import MixerConfig
from aiayn.errors import UserError
from aiayn.nn.context import Context
from aiayn.nn.linear import Linear

CHUNK = 64  # Q: long enough for matrix products, short enough for Q × Q blocks


@dataclass
class SSMState:
    """One layer's decoding state: the last K - 1 conv inputs (B, E + 2N, K-1) and
    h (B, H, P, N)."""

    conv: Tensor
    h: Tensor

    def reorder(self, index: Tensor) -> None:
        self.conv, self.h = self.conv.index_select(0, index), self.h.index_select(0, index)

    def nbytes(self) -> int:
        return self.conv.numel() * self.conv.element_size() + self.h.numel() * self.h.element_size()


def segment_sums(log_decay: Tensor) -> Tensor:
    """(..., Q) per-step log decays -> (..., Q, Q) with entry [t, s] = Σ_{s<j≤t} log_decay_j
    for s ≤ t and -inf above the diagonal, so that exp() gives the decay from s to t (1 on
    the diagonal, 0 where s > t).  A masked cumulative sum, not a difference of cumulative
    sums: every entry is a sum of non-positive numbers, so exp() cannot overflow."""
    q = log_decay.shape[-1]
    ones = torch.ones(q, q, dtype=torch.bool, device=log_decay.device)
    below = torch.tril(ones, -1)  # j > s
    x = log_decay[..., :, None].expand(*log_decay.shape, q)  # [..., j, s] = log_decay_j
    sums = x.masked_fill(~below, 0).cumsum(-2)  # [..., t, s] = Σ_{s<j≤t}
    return sums.masked_fill(~torch.tril(ones), -math.inf)


def chunked_scan(
    x: Tensor,
    log_decay: Tensor,
    b: Tensor,
    c: Tensor,
    h: Tensor | None = None,
    chunk: int = CHUNK,
) -> tuple[Tensor, Tensor]:
    """The scan for a whole sequence, in chunks (module docstring).

    ``x``: (B, T, H, P) inputs already multiplied by Δ; ``log_decay``: (B, T, H) = Δ_t A_h;
    ``b``, ``c``: (B, T, N); ``h``: the (B, H, P, N) state before (None = zeros).  Returns the
    (B, T, H, P) outputs h_t C_t (without D x) and the state after the last position."""
    bsz, t, heads, p = x.shape
    n = b.shape[-1]
    if h is None:
        h = x.new_zeros(bsz, heads, p, n)
    if t == 0:
        return x.new_zeros(bsz, 0, heads, p), h
    q = min(chunk, t)
    pad = -t % q
    if pad:  # zero inputs and no decay past the end: the final state is unchanged
        x, b, c = (F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad)) for v in (x, b, c))
        log_decay = F.pad(log_decay, (0, 0, 0, pad))
    g = (t + pad) // q
    xs = x.view(bsz, g, q, heads, p).permute(0, 3, 1, 2, 4)  # (B, H, G, Q, P)
    la = log_decay.view(bsz, g, q, heads).permute(0, 3, 1, 2)  # (B, H, G, Q)
    bs, cs = b.view(bsz, g, q, n), c.view(bsz, g, q, n)  # (B, G, Q, N)
    cum = la.cumsum(-1)  # (B, H, G, Q): log decay from the chunk's start to t

    # Within each chunk: y_t = Σ_{s≤t} exp(Σ_{s<j≤t} la_j) (C_t · B_s) x_s.
    scores = cs @ bs.transpose(-1, -2)  # (B, G, Q, Q): C_t · B_s
    y = (scores[:, None] * torch.exp(segment_sums(la))) @ xs  # (B, H, G, Q, P)

    # Each chunk's own final state (from zero): Σ_s exp(cum_end - cum_s) x_s B_sᵀ.
    to_end = torch.exp(cum[..., -1:] - cum)  # (B, H, G, Q)
    states = (xs * to_end[..., None]).transpose(-1, -2) @ bs[:, None]  # (B, H, G, P, N)

    # Hand the state over from chunk to chunk: the one sequential part, G steps.
    whole = torch.exp(cum[..., -1])  # (B, H, G): each chunk's total decay
    before = []
    for i in range(g):
        before.append(h)
        h = whole[:, :, i, None, None] * h + states[:, :, i]
    entering = torch.stack(before, 2)  # (B, H, G, P, N): the state entering each chunk

    # ... read out at every position of the chunk, decayed from the chunk's start.
    y = y + (cs[:, None] @ entering.transpose(-1, -2)) * torch.exp(cum)[..., None]
    y = y.permute(0, 2, 3, 1, 4).reshape(bsz, g * q, heads, p)[:, :t]  # (B, T, H, P)
    return y, h


def scan_step(
    x: Tensor, log_decay: Tensor, b: Tensor, c: Tensor, h: Tensor
) -> tuple[Tensor, Tensor]:
    """One step of the recurrence, for decoding: (B, H, P) x (times Δ), (B, H) log decay,
    (B, N) B and C, (B, H, P, N) state -> (B, H, P) output and the new state."""
    h = torch.exp(log_decay)[..., None, None] * h + x[..., None] * b[:, None, None, :]
    return (h @ c[:, None, :, None]).squeeze(-1), h  # (B, H, P)


def scan_reference(
    x: Tensor, log_decay: Tensor, b: Tensor, c: Tensor, h: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The recurrence one position at a time, written out plainly, for tests."""
    bsz, t, heads, p = x.shape
    if h is None:
        h = x.new_zeros(bsz, heads, p, b.shape[-1])
    ys = []
    for i in range(t):
        decay = torch.exp(log_decay[:, i])[:, :, None, None]  # (B, H, 1, 1)
        h = decay * h + x[:, i, :, :, None] * b[:, i, None, None, :]
        ys.append((h * c[:, i, None, None, :]).sum(-1))
    return torch.stack(ys, 1), h


class SelectiveSSM(nn.Module):
    """Mamba-2's mixer (module docstring): (B, T, C) -> (B, T, C), causal, with a state for
    decoding.  ``expand`` sets E = expand · C, cut into heads of ``head_dim`` channels;
    ``state_size`` is N; ``conv`` is K."""

    def __init__(
        self,
        d_model: int,
        *,
        state_size: int = 16,
        expand: int = 2,
        conv: int = 4,
        head_dim: int = 64,
        bias: bool = False,
        eps: float = 1e-5,
        layer: int = 0,
    ) -> None:
        super().__init__()
        e = expand * d_model
        if e % head_dim:
            raise UserError(
                f"ssm_head_dim={head_dim} must divide the inner width ssm_expand * d_model = {e}"
            )
        self.inner, self.state_size, self.kernel, self.layer = e, state_size, conv, layer
        self.heads, self.head_dim = e // head_dim, head_dim
        self.conv_width = e + 2 * state_size  # x, B and C go through the convolution
        # z (E), x (E), B (N), C (N), Δ (H) from one projection.
        self.in_proj = Linear(d_model, e + self.conv_width + self.heads, bias=bias)
        self.conv = nn.Conv1d(self.conv_width, self.conv_width, conv, groups=self.conv_width)
        self.dt_bias = nn.Parameter(torch.empty(self.heads))
        self.a_log = nn.Parameter(torch.empty(self.heads))  # A_h = -exp(a_log_h)
        self.d = nn.Parameter(torch.empty(self.heads))
        self.norm = nn.RMSNorm(e, eps=eps)
        self.out = Linear(e, d_model, bias=bias)
        self.post_init()

    @classmethod
    def from_config(
        cls, mixer: MixerConfig, d_model: int, *, bias: bool, eps: float, layer: int = 0
    ) -> SelectiveSSM:
        """The layer a model's ``MixerConfig`` describes (its ``ssm_*`` sizes), at width
        ``d_model``, with the model's biases and norm epsilon."""
        return cls(
            d_model,
            state_size=mixer.ssm_state,
            expand=mixer.ssm_expand,
            conv=mixer.ssm_conv,
            head_dim=mixer.ssm_head_dim,
            bias=bias,
            eps=eps,
            layer=layer,
        )

    @torch.no_grad()
    def post_init(self) -> None:
        """Mamba-2's own initialisation, which the model's generic one (matrices and zero
        biases) must not undo: Δ's bias such that softplus gives steps in [1e-3, 0.1],
        log-uniform; A_h uniform in [1, 16]; D = 1."""
        dt = torch.exp(torch.rand(self.heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹(dt)
        self.a_log.copy_(torch.log(torch.empty(self.heads).uniform_(1.0, 16.0)))
        self.d.fill_(1.0)

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        if not ctx.causal:
            raise UserError("the selective state-space layer is causal (decoder-only models)")
        bsz, t, _ = x.shape
        e, n, k, heads, p = self.inner, self.state_size, self.kernel, self.heads, self.head_dim
        keep = ctx.new_token_keep(t)  # (B, T) or None
        z, xbc, dt = self.in_proj(x).split([e, self.conv_width, heads], dim=-1)
        if keep is not None:  # padding enters neither the convolution nor the state
            xbc = xbc * keep[..., None].to(xbc.dtype)
        layer = None if ctx.cache is None else ctx.cache.layers[self.layer]
        state = layer.state if layer is not None and isinstance(layer.state, SSMState) else None
        history = (
            state.conv if state is not None else xbc.new_zeros(bsz, self.conv_width, k - 1)
        )  # (B, E + 2N, K-1)
        window = torch.cat([history, xbc.transpose(1, 2)], dim=-1)  # (B, E + 2N, K-1+T)
        xbc = F.silu(self.conv(window).transpose(1, 2))  # (B, T, E + 2N)
        u, b, c = xbc.split([e, n, n], dim=-1)
        delta = F.softplus(dt.float() + self.dt_bias.float())  # (B, T, H)
        if keep is not None:
            delta = delta * keep[..., None].to(delta.dtype)  # padding: no step, no input
        a = -torch.exp(self.a_log.float())  # (H,)
        u = u.float().view(bsz, t, heads, p)  # (B, T, H, P)
        xs, log_decay = u * delta[..., None], delta * a  # (B, T, H, P), (B, T, H)
        h = None if state is None else state.h
        if t == 1 and h is not None:  # decoding: one step of the recurrence
            y1, h = scan_step(xs[:, 0], log_decay[:, 0], b[:, 0].float(), c[:, 0].float(), h)
            y = y1[:, None]
        else:
            y, h = chunked_scan(xs, log_decay, b.float(), c.float(), h)
        y = y + self.d.float()[:, None] * u  # (B, T, H, P)
        if layer is not None:
            layer.state = SSMState(window[..., window.shape[-1] - (k - 1) :].detach(), h.detach())
        y = y.reshape(bsz, t, e).to(x.dtype)
        return self.out(self.norm(y * F.silu(z)))
