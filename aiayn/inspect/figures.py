"""Pictures of the mechanism: attention maps, positional encodings, and the worked examples.

Every function writes one small PNG (matplotlib, Agg, no display) and returns its path; the
worked examples (``example_*``) also return the numbers they print.  Every number in them is
computed by the library -- ``aiayn.scaled_dot_product_attention`` with the reference
backend, ``aiayn.nn.positions.sinusoidal_table``, ``RotaryEmbedding``
-- none is typed in.

* ``attention_heatmap`` -- one (T, S) weight matrix, queries down, keys across.
* ``attention_grid`` -- one layer's heads side by side.
* ``all_layers`` -- layers x heads (or one head-averaged map per layer).
* ``positional_encoding_image``, ``positional_similarity`` -- §3.5's sinusoids.
* ``rope_relative_scores`` -- RoPE's q·k depends on the offset only.
* ``example_trophy`` -- "the trophy did not fit in the suitcase because it was too big".
* ``example_not_good`` -- "not good" through causal attention by hand.
* ``example_scale`` -- why divide by sqrt(d_k): the unscaled softmax saturates.
* ``example_paths`` -- gradients through k recurrent steps vs one attention step.

Matplotlib is imported inside the functions, so ``import aiayn`` does not need it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from aiayn.errors import UserError
from aiayn.inspect.teaching import check_sizes
from aiayn.inspect.teaching import positional_similarity as pe_similarity
from aiayn.nn.positions import RotaryEmbedding, apply_rotary, sinusoidal_table

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 120
Numbers = dict[str, Any]
ArrayLike = Tensor | np.ndarray | Sequence[Sequence[float]]


# ----- plumbing ---------------------------------------------------------------------------


def new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def save_figure(fig: Figure, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out


def _array(x: ArrayLike) -> np.ndarray:
    if isinstance(x, Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def clean_label(token: str) -> str:
    """A token made printable: spaces and newlines visible, mathtext's ``$`` escaped."""
    table = {" ": "·", "Ġ": "·", "\n": "\\n", "Ċ": "\\n", "\t": "\\t", "$": r"\$"}
    return "".join(table.get(c, c) for c in token) or "∅"


def _labels(labels: Sequence[str] | None, n: int) -> list[str]:
    if labels is None:
        return [str(i) for i in range(n)]
    if len(labels) != n:
        raise UserError(f"{len(labels)} labels for {n} rows/columns")
    return [clean_label(t) for t in labels]


def heat_panel(
    ax: Axes,
    w: np.ndarray,
    rows: list[str],
    cols: list[str],
    title: str,
    *,
    ticks: bool = True,
    annotate: bool = False,
    vmax: float | None = None,
    fontsize: float | None = None,
) -> Any:
    top = max(float(w.max()) if vmax is None else vmax, 1e-9)
    im = ax.imshow(w, cmap="viridis", vmin=0.0, vmax=top, aspect="auto")
    ax.set_title(title, fontsize=9)
    if ticks:
        small = fontsize or (8 if max(w.shape) <= 16 else 6)
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=small)
        ax.set_yticks(range(len(rows)), rows, fontsize=small)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                shade = "black" if w[i, j] > 0.6 * w.max() else "white"
                ax.text(j, i, f"{w[i, j]:.2f}", ha="center", va="center", fontsize=7, color=shade)
    return im


# ----- attention maps ---------------------------------------------------------------------


def attention_heatmap(
    weights: ArrayLike,
    row_labels: Sequence[str] | None,
    col_labels: Sequence[str] | None,
    path: str | Path,
    title: str = "attention weights",
) -> Path:
    """One (T, S) matrix: row i is query i's distribution over the S keys."""
    w = _array(weights)
    if w.ndim != 2:
        raise UserError(f"attention_heatmap needs a (T, S) matrix, got shape {w.shape}")
    t, s = w.shape
    side = min(max(3.0, 0.25 * max(t, s) + 1.5), 10.0)
    fig = new_figure(side + 0.8, side)
    ax = fig.add_subplot()
    rows, cols = _labels(row_labels, t), _labels(col_labels, s)
    small = max(t, s) <= 10
    im = heat_panel(ax, w, rows, cols, title, annotate=small, fontsize=8 if max(t, s) <= 48 else 5)
    ax.set_xlabel("key (attended to)", fontsize=8)
    ax.set_ylabel("query (attending)", fontsize=8)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return save_figure(fig, path)


def _panel_grid(
    maps: list[np.ndarray],
    titles: list[str],
    rows: list[str],
    cols: list[str],
    ncols: int,
    path: str | Path,
    title: str,
) -> Path:
    n = len(maps)
    nrows = math.ceil(n / ncols)
    t, s = maps[0].shape
    ticks = max(t, s) <= 24
    panel = 2.2 if ticks else 1.5
    fig = new_figure(panel * ncols + 0.6, panel * nrows + 0.5)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    im, top = None, max(float(m.max()) for m in maps)  # one colour scale for every panel
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.axis("off")
            continue
        im = heat_panel(ax, maps[k], rows, cols, titles[k], ticks=ticks, vmax=top)
        if ticks:  # labels on the outer panels only
            if k % ncols:
                ax.set_yticklabels([])
            if k < n - ncols:
                ax.set_xticklabels([])
    fig.suptitle(title, fontsize=10)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.6)
    return save_figure(fig, path)


def attention_grid(
    weights: ArrayLike,
    row_labels: Sequence[str] | None,
    col_labels: Sequence[str] | None,
    path: str | Path,
    title: str = "attention heads",
) -> Path:
    """One layer's heads, (H, T, S), one panel per head."""
    w = _array(weights)
    if w.ndim != 3:
        raise UserError(f"attention_grid needs (H, T, S) weights, got shape {w.shape}")
    h, t, s = w.shape
    return _panel_grid(
        list(w),
        [f"head {i}" for i in range(h)],
        _labels(row_labels, t),
        _labels(col_labels, s),
        min(h, 4),
        path,
        title,
    )


def all_layers(
    weights: Sequence[ArrayLike],
    row_labels: Sequence[str] | None,
    col_labels: Sequence[str] | None,
    path: str | Path,
    title: str = "attention, all layers",
    *,
    average_heads: bool | None = None,
) -> Path:
    """Every layer: a layers x heads grid, or (``average_heads``) one head-averaged map per
    layer.  By default heads are averaged when the grid would exceed 64 panels."""
    ws = [_array(w) for w in weights]
    if not ws or any(w.ndim != 3 for w in ws):
        raise UserError("all_layers needs a non-empty list of (H, T, S) weights")
    n_layers, h = len(ws), ws[0].shape[0]
    t, s = ws[0].shape[1:]
    rows, cols = _labels(row_labels, t), _labels(col_labels, s)
    if average_heads is None:
        average_heads = n_layers * h > 64
    if average_heads:
        maps = [w.mean(axis=0) for w in ws]
        titles = [f"layer {i} (mean of {w.shape[0]} heads)" for i, w in enumerate(ws)]
        return _panel_grid(maps, titles, rows, cols, min(n_layers, 4), path, title)
    maps = [w[j] for w in ws for j in range(w.shape[0])]
    titles = [f"L{i} H{j}" for i, w in enumerate(ws) for j in range(w.shape[0])]
    return _panel_grid(maps, titles, rows, cols, h, path, title)


# ----- positions --------------------------------------------------------------------------


def positional_encoding_image(max_len: int, d_model: int, path: str | Path) -> Path:
    """§3.5's table: dimension down (fast waves at the top), position across."""
    check_sizes(max_len, d_model)
    table = sinusoidal_table(max_len, d_model).numpy()
    fig = new_figure(6.4, 3.6)
    ax = fig.add_subplot()
    im = ax.imshow(table.T, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    ax.set_xlabel("position")
    ax.set_ylabel("dimension (sin even, cos odd)")
    ax.set_title(f"sinusoidal positional encoding, d_model={d_model} (§3.5)", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8)
    return save_figure(fig, path)


def positional_similarity(max_len: int, d_model: int, position: int, path: str | Path) -> Path:
    """PE(position) · PE(p) for every p: peaks at ``position`` and falls off with distance."""
    sim = pe_similarity(max_len, d_model, position)
    fig = new_figure(6.4, 3.0)
    ax = fig.add_subplot()
    ax.plot(range(max_len), sim, color="tab:blue")
    ax.axvline(position, color="tab:red", ls="--", lw=1, label=f"position {position}")
    ax.set_xlabel("position p")
    ax.set_ylabel(f"PE({position}) · PE(p)")
    ax.set_title("similarity of one position's encoding to all others", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def rope_scores(
    dim: int, max_offset: int, starts: Sequence[int] = (0, 20, 60), seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Offsets -max_offset..max_offset and, for each start position m, the RoPE score
    ``rot(q, m + max_offset + r) · rot(k, m + max_offset)`` of one fixed random (q, k) pair:
    rows that are equal show the score depends on the offset r only."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, dim, generator=gen)
    offsets = torch.arange(-max_offset, max_offset + 1)
    span = max(starts) + 2 * max_offset + 1
    rope = RotaryEmbedding(dim, span)
    positions = torch.arange(span)
    cos, sin = rope(positions)  # (1, 1, P, D)
    q_rot = apply_rotary(q.expand(1, 1, span, dim), cos, sin)[0, 0]  # (P, D)
    k_rot = apply_rotary(k.expand(1, 1, span, dim), cos, sin)[0, 0]
    rows = []
    for m in starts:
        key_pos = m + max_offset
        rows.append((q_rot[key_pos + offsets] * k_rot[key_pos]).sum(-1))
    return offsets.numpy(), torch.stack(rows).numpy()


def rope_relative_scores(dim: int, max_offset: int, path: str | Path, seed: int = 0) -> Path:
    """RoPE's q·k as a function of the offset, for several absolute positions: the curves
    coincide, so the score depends only on how far apart the tokens are."""
    starts = (0, 20, 60)
    offsets, scores = rope_scores(dim, max_offset, starts, seed)
    fig = new_figure(6.4, 3.0)
    ax = fig.add_subplot()
    styles = ["-", "--", ":"]
    for m, row, style in zip(starts, scores, styles, strict=True):
        ax.plot(
            offsets,
            row,
            style,
            lw=2 if style == "-" else 1.5,
            label=f"key at position {m + max_offset}",
        )
    ax.set_xlabel("offset (query position - key position)")
    ax.set_ylabel("rotated q · k")
    ax.set_title(f"RoPE score of one random (q, k) pair, head size {dim}", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
