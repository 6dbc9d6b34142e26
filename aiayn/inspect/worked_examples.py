"""The seeds' worked examples as figures with their numbers: the trophy, "not good", the scale
of dot products, the paths a signal takes, and Nadaraya-Watson regression as attention."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from aiayn.inspect.figures import Numbers, heat_panel, new_figure, save_figure
from aiayn.inspect.teaching import rounded
from aiayn.nn.attention import scaled_dot_product_attention

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def _bars(ax: Axes, labels: list[str], values: list[float], title: str, color: str) -> None:
    bars = ax.bar(labels, values, color=color)
    ax.bar_label(bars, [f"{v:.3f}" for v in values], fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.axhline(0, color="black", lw=0.6)
    ax.margins(y=0.15)


def example_trophy(path: str | Path) -> tuple[Path, Numbers]:
    """ "The trophy did not fit in the suitcase because it was too big": the query of "it"
    (2, 1, -1) against four keys.  Scores 5.2, 0, -0.2, 0; scaled by 1/sqrt(3) and
    softmaxed, about 0.874 of the attention lands on "trophy"."""
    tokens = ["trophy", "large", "suitcase", "because"]
    q = torch.tensor([[2.0, 1.0, -1.0]])
    k = torch.tensor([[1.8, 0.8, -0.8], [0.2, 0.1, 0.5], [0.3, 0.5, 1.3], [0.0, 0.0, 0.0]])
    v = k.clone()  # each token hands over its own features
    out, w = scaled_dot_product_attention(q, k, v, return_weights=True, backend="reference")
    _, w_raw = scaled_dot_product_attention(
        q, k, v, scale=False, return_weights=True, backend="reference"
    )
    scores = q @ k.T
    numbers: Numbers = {
        "tokens": tokens,
        "query": rounded(q[0]),
        "scores": rounded(scores[0]),
        "scaled_scores": rounded(scores[0] / math.sqrt(q.shape[-1])),
        "weights": rounded(w[0]),
        "weights_unscaled": rounded(w_raw[0]),
        "output": rounded(out[0]),
    }
    fig = new_figure(9.0, 3.0)
    a, b, c = fig.subplots(1, 3)
    _bars(a, tokens, numbers["scores"], "score q·k", "tab:gray")
    _bars(b, tokens, numbers["weights"], "softmax(q·k / √3)", "tab:blue")
    _bars(c, tokens, numbers["weights_unscaled"], "without the scale: softmax(q·k)", "tab:orange")
    for ax in (a, b, c):
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle('"it" (query 2, 1, -1) looks for what was too big', fontsize=10)
    return save_figure(fig, path), numbers


def example_not_good(path: str | Path) -> tuple[Path, Numbers]:
    """Two tokens, "not" then "good", causal attention with QK^T = [[0, 1], [1, 0]] and
    values (negation, polarity) = not (-2, 0), good (0, 2).  "not" sees only itself; "good"
    puts 0.67 on "not" and 0.33 on itself and comes out as (-1.34, 0.66): negated."""
    tokens = ["not", "good"]
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    k = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # Q K^T = [[0, 1], [1, 0]]
    v = torch.tensor([[-2.0, 0.0], [0.0, 2.0]])
    out, w = scaled_dot_product_attention(
        q, k, v, is_causal=True, return_weights=True, backend="reference"
    )
    scores = q @ k.T
    scaled = scores / math.sqrt(q.shape[-1])
    masked = scaled.masked_fill(torch.ones(2, 2, dtype=torch.bool).triu(1), float("-inf"))
    numbers: Numbers = {
        "tokens": tokens,
        "scores": rounded(scores),
        "scaled_scores_masked": rounded(masked),
        "values": rounded(v),
        "weights": rounded(w),
        "output": rounded(out),
    }
    fig = new_figure(9.0, 3.0)
    a, b, c = fig.subplots(1, 3)
    shown = np.where(np.isinf(masked.numpy()), np.nan, masked.numpy())
    a.imshow(shown, cmap="Greys", vmin=-1, vmax=1.5)
    for i in range(2):
        for j in range(2):
            a.text(j, i, "-∞" if j > i else f"{masked[i, j]:.2f}", ha="center", va="center")
    a.set_title("QKᵀ/√2, causal mask", fontsize=9)
    heat_panel(b, w.numpy(), tokens, tokens, "weights (rows sum to 1)", annotate=True)
    for ax in (a, b):
        ax.set_xticks(range(2), tokens, rotation=0)
        ax.set_yticks(range(2), tokens)
    vn, on = v.numpy(), out.numpy()
    arrows = [
        (vn[1], "tab:green", "value of good"),
        (vn[0], "tab:gray", "value of not = output of not"),
        (on[1], "tab:red", "output of good"),
    ]
    for (x, y), color, label in arrows:
        c.annotate("", (x, y), (0, 0), arrowprops={"arrowstyle": "-|>", "color": color, "lw": 2})
        c.plot([], [], color=color, lw=2, label=f"{label} ({x:.2f}, {y:.2f})")
    c.set_xlim(-2.6, 1.0)
    c.set_ylim(-0.6, 2.6)
    c.set_aspect("equal")
    c.axhline(0, color="black", lw=0.5)
    c.axvline(0, color="black", lw=0.5)
    c.set_xlabel("negation", fontsize=8)
    c.set_ylabel("polarity", fontsize=8)
    c.legend(fontsize=7, loc="upper left")
    c.set_title("output = weights × values", fontsize=9)
    fig.suptitle('"not good": good looks back at not and is negated', fontsize=10)
    return save_figure(fig, path), numbers


def example_scale(
    path: str | Path,
    d_ks: Sequence[int] = (4, 8, 16, 32, 64, 128, 256, 512, 1024),
    n_keys: int = 16,
    trials: int = 256,
    seed: int = 0,
) -> tuple[Path, Numbers]:
    """§3.2.1: with q, k of unit-variance entries, q·k has variance d_k.  Unscaled, the softmax
    saturates as d_k grows -- its entropy falls towards 0 (one-hot) and so does its gradient,
    the norm of the Jacobian diag(p) - p pᵀ of the weights with respect to the logits.  With
    the 1/sqrt(d_k) scale both stay put."""
    gen = torch.Generator().manual_seed(seed)
    numbers: Numbers = {
        "d_k": list(d_ks),
        "n_keys": n_keys,
        "max_entropy": round(math.log(n_keys), 4),
    }
    for name in ("entropy_scaled", "entropy_unscaled", "grad_scaled", "grad_unscaled"):
        numbers[name] = []
    for d in d_ks:
        q = torch.randn(trials, 1, d, generator=gen)
        k = torch.randn(trials, n_keys, d, generator=gen)
        v = torch.zeros(trials, n_keys, 1)
        for label, scale in (("scaled", True), ("unscaled", False)):
            _, p = scaled_dot_product_attention(
                q, k, v, scale=scale, return_weights=True, backend="reference"
            )
            p = p[:, 0].double()  # (trials, n_keys)
            entropy = -(p * p.clamp_min(1e-300).log()).sum(-1).mean()
            jac = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
            grad = torch.linalg.matrix_norm(jac).mean()
            numbers[f"entropy_{label}"].append(round(float(entropy), 4))
            numbers[f"grad_{label}"].append(round(float(grad), 4))
    fig = new_figure(9.0, 3.2)
    a, b = fig.subplots(1, 2)
    for ax, key, ylabel in (
        (a, "entropy", "softmax entropy (nats)"),
        (b, "grad", "‖∂softmax/∂logits‖"),
    ):
        ax.plot(d_ks, numbers[f"{key}_scaled"], "o-", label="scaled by 1/√d_k")
        ax.plot(d_ks, numbers[f"{key}_unscaled"], "s--", label="unscaled")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("d_k")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a.axhline(numbers["max_entropy"], color="gray", ls=":", lw=1)
    a.set_title(f"entropy over {n_keys} keys (uniform = {numbers['max_entropy']:.2f})", fontsize=9)
    b.set_title("gradient through the softmax", fontsize=9)
    fig.suptitle("without 1/√d_k the softmax saturates: entropy → 0, gradient → 0", fontsize=10)
    return save_figure(fig, path), numbers


def example_paths(path: str | Path, max_steps: int = 50) -> tuple[Path, Numbers]:
    """The gradient from step k back to step 0: through k recurrent steps h_t = w h_(t-1) it
    is w^k (0.9^50 ≈ 0.005, 1.1^50 ≈ 117), by autograd; through one attention step whose
    query matches the distant token's key it is that token's weight, about 1 for every k."""
    steps = list(range(max_steps + 1))
    numbers: Numbers = {"steps": steps}
    for w in (0.9, 1.1):
        grads = []
        for k in steps:
            h0 = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
            h = h0
            for _ in range(k):
                h = w * h
            (g,) = torch.autograd.grad(h, h0)
            grads.append(float(g))
        numbers[f"recurrent_{w}"] = grads
    attn = []
    for k in steps:  # token k attends to token 0, k positions back, in one step
        keys = torch.zeros(k + 1, 2, dtype=torch.float64)
        keys[0, 0] = 4.0
        query = torch.tensor([[4.0, 0.0]], dtype=torch.float64)
        values = torch.zeros(k + 1, 1, dtype=torch.float64, requires_grad=True)
        out = scaled_dot_product_attention(query, keys, values, backend="reference")
        assert isinstance(out, Tensor)
        (g,) = torch.autograd.grad(out.sum(), values)
        attn.append(float(g[0, 0]))
    numbers["attention"] = attn
    numbers["attention_path_length"] = 1
    fig = new_figure(6.4, 3.4)
    ax = fig.add_subplot()
    ax.semilogy(steps, numbers["recurrent_0.9"], label="recurrent, factor 0.9: 0.9^k (vanishes)")
    ax.semilogy(steps, numbers["recurrent_1.1"], label="recurrent, factor 1.1: 1.1^k (explodes)")
    ax.semilogy(steps, attn, lw=2, label="attention: one step, path length 1")
    ax.annotate(
        f"{numbers['recurrent_0.9'][-1]:.4f}",
        (steps[-1], numbers["recurrent_0.9"][-1]),
        fontsize=8,
        ha="right",
        va="bottom",
    )
    ax.annotate(
        f"{numbers['recurrent_1.1'][-1]:.1f}",
        (steps[-1], numbers["recurrent_1.1"][-1]),
        fontsize=8,
        ha="right",
        va="top",
    )
    ax.set_xlabel("distance k (tokens back)")
    ax.set_ylabel("gradient magnitude")
    ax.set_title("how much token k-back influences learning", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, path), numbers


def example_nadaraya_watson(
    path: str | Path, sigmas: Sequence[float] = (0.05, 0.3, 1.0, 3.0)
) -> tuple[Path, Numbers]:
    """Attention as the Nadaraya-Watson kernel smoother (1964): Gaussian-kernel regression of
    noisy sin(x) samples at several bandwidths, each computed as unscaled dot-product attention
    (aiayn/inspect/teaching.py) and checked against the kernel formula; the bandwidth is the
    softmax's sharpness -- small chases the noise, large flattens the curve."""
    from aiayn.inspect.teaching import nadaraya_watson

    runs = [nadaraya_watson(s) for s in sigmas]
    numbers: Numbers = {
        "sigmas": list(sigmas),
        "mse_vs_truth": [r["mse_vs_truth"] for r in runs],
        "max_difference_formula_vs_attention": max(
            r["max_difference_formula_vs_attention"] for r in runs
        ),
        "query": runs[0]["query"],
        "query_entropy": [r["query_entropy"] for r in runs],
    }
    fig = new_figure(10.0, 3.6)
    a, b = fig.subplots(1, 2)
    a.scatter(runs[0]["x_train"], runs[0]["y_train"], s=12, color="black", label="samples")
    a.plot(runs[0]["grid"], runs[0]["truth"], color="gray", ls=":", label="sin x")
    for r in runs:
        a.plot(r["grid"], r["estimate"], label=f"σ = {r['sigma']} (MSE {r['mse_vs_truth']:.3f})")
        b.plot(r["x_train"], r["query_weights"], "o-", ms=3, label=f"σ = {r['sigma']}")
    a.set_xlabel("x")
    a.set_title("softmax(q·kᵢ) yᵢ with q = (x/σ², 1), kᵢ = (xᵢ, −xᵢ²/2σ²)", fontsize=9)
    a.legend(fontsize=7)
    b.axvline(numbers["query"], color="gray", lw=1)
    b.set_xlabel("sample xᵢ")
    b.set_ylabel("attention weight")
    b.set_title(f"the weights of the query x = {numbers['query']}", fontsize=9)
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.suptitle("attention is Nadaraya-Watson kernel regression; σ is the sharpness", fontsize=10)
    return save_figure(fig, path), numbers


EXAMPLES = {
    "trophy": example_trophy,
    "not-good": example_not_good,
    "scale": example_scale,
    "paths": example_paths,
    "nadaraya-watson": example_nadaraya_watson,
}


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def format_numbers(numbers: Numbers) -> str:
    """The numbers of a worked example, one per line (long series shortened)."""
    lines = []
    for key, value in numbers.items():
        if isinstance(value, list) and len(value) > 12:
            head, tail = value[:5], value[-3:]
            text = _fmt(head)[:-1] + ", ..., " + _fmt(tail)[1:]
        else:
            text = _fmt(value)
        lines.append(f"{key:<22} {text}")
    return "\n".join(lines)
