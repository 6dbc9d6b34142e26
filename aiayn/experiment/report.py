"""A sweep's results as files: JSON, CSV, a markdown table in Table 3's layout, and a plot.

The markdown table follows Table 3 of the paper: the base row in full, and in every other
row only the cells that differ from the base (blank = as in the base), then the scores --
perplexity and BLEU on the validation set, BLEU on the test set, parameters, training FLOPs
and minutes.  Settings Table 3 has no column for (additive scores, no scale, no residual,
the norm's place) go in a last column.
"""

from __future__ import annotations

import csv
import json
import math
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from aiayn.experiment.spec import Sweep

# (header, key in result["model"] or a callable) -- Table 3's architecture columns.
COLUMNS: list[tuple[str, str]] = [
    ("N", "n_layers"),
    ("d_model", "d_model"),
    ("d_ff", "d_ff"),
    ("h", "n_heads"),
    ("d_k", "d_head"),
    ("d_v", "d_head"),
    ("P_drop", "dropout"),
    ("ε_ls", "label_smoothing"),
    ("positions", "positional"),
]
OTHER = {  # setting -> how a non-default value reads in the "other" column
    "attention_score": lambda v: "additive scores" if v == "additive" else "",
    "attention_scale": lambda v: "" if v else "no 1/√d_k",
    "residual": lambda v: "" if v else "no residual",
    "norm_position": lambda v: f"{v}-LN",
    "rnn": lambda v: "" if v is None else f"{v.upper()}",
    "rnn_attention": lambda v: "" if v is None else ("attention" if v else "no attention"),
    "mixer": lambda v: (
        "" if v in (None, "attention") else ("selective SSM" if v == "ssm" else f"{v} attention")
    ),
    "attention_every": lambda v: "" if v is None else f"softmax every {v} layers",
}
# What a result written before a setting existed ran with.
MISSING: dict[str, Any] = {
    "mixer": "attention",
    "attention_every": None,
    "rnn": None,
    "rnn_attention": None,
}
CSV_FIELDS = [
    "name",
    "row",
    "note",
    "n_layers",
    "d_model",
    "d_ff",
    "n_heads",
    "d_head",
    "dropout",
    "label_smoothing",
    "positional",
    "norm_position",
    "attention_score",
    "attention_scale",
    "residual",
    "rnn",
    "rnn_attention",
    "mixer",
    "attention_every",
    "params",
    "params_non_embedding",
    "steps",
    "max_tokens",
    "train_target_tokens",
    "train_tokens",
    "train_flops",
    "train_seconds",
    "matmul_gflops",
    "val_loss",
    "val_ppl",
    "best_val_loss",
    "val_bleu",
    "val_chrf",
    "test_bleu",
    "test_chrf",
    "diverged",
]


def _value(result: dict[str, Any], key: str) -> Any:
    if key == "label_smoothing":
        return result.get("label_smoothing")
    return result.get("model", {}).get(key)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


def _fmt(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}"


def markdown_table(sweep: Sweep, results: list[dict[str, Any]]) -> str:
    """Table 3's layout (see the module docstring); a language-model sweep shows the
    validation loss in place of the translation scores."""
    trained = [r for r in results if "model" in r]
    base = next((r for r in trained if r["row"] == "base"), trained[0] if trained else None)
    lm = bool(results) and all("val_bleu" not in r for r in results if "model" in r)
    scores = ["val loss", "PPL (dev)"] if lm else ["PPL (dev)", "BLEU (dev)"]
    head = ["", "variant"] + [c for c, _ in COLUMNS] + ["other", *scores]
    head += (["BLEU (test)"] if sweep.test and not lm else []) + [
        "params ×10⁶",
        "TFLOP",
        "train min",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "model" not in r:
            cells = [r["row"], r["name"], *[""] * (len(head) - 3), "diverged"]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        is_base = r is base
        cells = [r["row"], r["name"]]
        for _, key in COLUMNS:
            v = _value(r, key)
            same = base is not None and not is_base and v == _value(base, key)
            cells.append("" if same else _cell(v))
        other = []
        for key, say in OTHER.items():
            v = r["model"].get(key, MISSING.get(key))  # older results lack newer settings
            if is_base or base is None or v != base["model"].get(key, MISSING.get(key)):
                other.append(say(v))
        if r["model"]["n_decoder_layers"] != r["model"]["n_layers"]:
            other.append(f"{r['model']['n_decoder_layers']} decoder layers")
        if r.get("diverged"):
            other.append("diverged")
        cells.append(", ".join(o for o in other if o))
        if lm:
            cells += [_fmt(r["val_loss"], 4), _fmt(r["val_ppl"], 3)]
        else:
            cells += [_fmt(r["val_ppl"], 2), _fmt(r.get("val_bleu"), 2)]
            cells += [_fmt(r.get("test_bleu"), 2)] if sweep.test else []
        cells += [
            _fmt(r["params"] / 1e6, 1),
            _fmt(r["train_flops"] / 1e12, 1),
            _fmt(r["train_seconds"] / 60, 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(path: Path, results: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in results:
            flat = {**r, **r.get("model", {})}
            writer.writerow({k: flat.get(k, "") for k in CSV_FIELDS})


def power_law(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """The least-squares line through (log x, log y): y = a · x^(-alpha); (a, alpha)."""
    slope, intercept = np.polyfit(np.log(xs), np.log(ys), 1)
    return float(math.exp(intercept)), float(-slope)


def scaling_fits(results: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Power laws of the validation loss in non-embedding parameters and in training FLOPs
    (Kaplan et al., 2020), over the variants that trained."""
    done = [r for r in results if math.isfinite(r.get("val_loss", math.nan))]
    if len(done) < 2:
        return {}
    losses = [r["val_loss"] for r in done]
    fits = {}
    for key in ("params_non_embedding", "train_flops"):
        a, alpha = power_law([float(r[key]) for r in done], losses)
        fits[key] = {"a": a, "alpha": alpha}
    return fits


def plot_scaling(path: Path, sweep: Sweep, results: list[dict[str, Any]]) -> None:
    """Validation loss against non-embedding parameters and against training FLOPs, log-log,
    with the fitted power laws drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if math.isfinite(r.get("val_loss", math.nan))]
    fits = scaling_fits(done)
    if not fits:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, key, label in (
        (axes[0], "params_non_embedding", "non-embedding parameters"),
        (axes[1], "train_flops", "training FLOPs"),
    ):
        xs = [float(r[key]) for r in done]
        ax.loglog(xs, [r["val_loss"] for r in done], "o", color="#4477aa")
        for r, x in zip(done, xs, strict=True):
            ax.annotate(
                r["name"], (x, r["val_loss"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
        a, alpha = fits[key]["a"], fits[key]["alpha"]
        grid = np.geomspace(min(xs), max(xs), 50)
        ax.loglog(
            grid, a * grid**-alpha, "--", color="#cc3311", label=f"fit: {a:.3g} · x^-{alpha:.3f}"
        )
        ax.set_xlabel(label)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("validation loss (nats/token)")
    fig.suptitle(sweep.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(path: Path, sweep: Sweep, results: list[dict[str, Any]]) -> None:
    """Validation BLEU and perplexity of every variant, the base's drawn as a line (or, for
    ``plot = "scaling"``, ``plot_scaling``)."""
    if sweep.plot == "scaling":
        plot_scaling(path, sweep, results)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [r for r in results if "val_bleu" in r]
    if not scored:  # a language-model sweep: its validation loss
        _plot_losses(path, sweep, [r for r in results if "val_loss" in r])
        return
    names = [f"{r['row']} {r['name']}" for r in scored]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.32 * len(scored) + 1.5), sharey=True)
    y = list(range(len(scored)))[::-1]
    base = next((r for r in scored if r["row"] == "base"), None)
    # Perplexity on a log axis from 1 (its floor): a diverged row (hundreds) would otherwise
    # flatten every other bar.
    panels = ((axes[0], "val_bleu", "BLEU (dev)"), (axes[1], "val_ppl", "PPL (dev, log scale)"))
    for ax, key, label in panels:
        floor = 1.0 if key == "val_ppl" else 0.0
        values = [r[key] if math.isfinite(r[key]) else floor for r in scored]
        colors = ["#888" if r is base else "#4477aa" for r in scored]
        ax.barh(y, [v - floor for v in values], left=floor, color=colors)
        if key == "val_ppl":
            ax.set_xscale("log")
        if base is not None:
            ax.axvline(base[key], color="#cc3311", lw=1)
        ax.set_xlabel(label)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, names, fontsize=8)
    fig.suptitle(sweep.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_losses(path: Path, sweep: Sweep, results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        return
    names = [f"{r['row']} {r['name']}" for r in results]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(results) + 1.5))
    y = list(range(len(results)))[::-1]
    ax.barh(y, [r["val_loss"] for r in results], color="#4477aa")
    low = min(r["val_loss"] for r in results)
    ax.set_xlim(left=max(0.0, low - 0.3))
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel("validation loss (nats/token)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("\n".join(textwrap.wrap(sweep.title, 80)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(sweep: Sweep, results: list[dict[str, Any]], out: Path) -> list[Path]:
    """results.json, results.csv, table.md and plot.png in ``out``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.csv", out / "table.md", out / "plot.png"]
    summary: dict[str, Any] = {"title": sweep.title, "variants": results}
    if sweep.plot == "scaling":
        summary["power_laws"] = scaling_fits(results)
    paths[0].write_text(json.dumps(summary, indent=1))
    write_csv(paths[1], results)
    paths[2].write_text(f"### {sweep.title}\n\n" + markdown_table(sweep, results))
    plot(paths[3], sweep, results)
    return [p for p in paths if p.exists()]
