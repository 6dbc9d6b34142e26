"""The cost calculator's report: a model's parameters, FLOPs and memory at one context and
precision, from aiayn/inspect/calc.py's counts, and its text for ``aiayn calc``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.checkpoint import CONFIG_FILE, read_config
from aiayn.config import ModelConfig, get_preset, presets
from aiayn.errors import UserError
from aiayn.inspect.calc import (
    DECODING_PRECISIONS,
    ParameterBreakdown,
    _attention_sublayers,
    _positive,
    attention_score_bytes,
    cross_kv_cache_bytes,
    decoding_bytes_per_token,
    dtype_size,
    forward_flops_per_token,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    kv_cached_positions,
    matmul_parameters,
    parameter_breakdown,
    recurrent_state_bytes,
    training_flops_per_token,
)


@dataclass(frozen=True)
class CostReport:
    """Everything ``cost_report`` works out for one config, context, batch and dtype."""

    name: str
    arch: str
    context: int
    batch: int
    dtype: str
    dtype_bytes: int
    parameters: int
    breakdown: ParameterBreakdown
    matmul_parameters: int
    weight_bytes: int
    training_flops_per_token: int
    forward_flops_per_token: int
    training_flops_per_step: int  # one forward + backward over batch x context tokens
    kv_cache_bytes_per_token: int
    kv_cached_positions: int
    kv_cache_bytes: int
    recurrent_state_bytes: int  # the linear-attention layers' part of kv_cache_bytes
    cross_kv_cache_bytes: int
    attention_sublayers: int
    attention_score_bytes: int  # per sublayer, reference backend
    # bytes read per decoded token at batch 1 after `context` tokens, by precision
    decoding_bytes_per_token: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["breakdown"]["total"] = self.breakdown.total
        data["notes"] = list(self.notes)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def cost_report(
    config: ModelConfig,
    context: int | None = None,
    batch: int = 1,
    dtype: str = "bf16",
    *,
    name: str = "custom",
) -> CostReport:
    """Parameters, FLOPs and memory of ``config`` at ``context`` tokens (default: max_len),
    ``batch`` sequences, weights and activations in ``dtype``."""
    c = config
    context = c.max_len if context is None else _positive("context", context)
    _positive("batch", batch)
    size = dtype_size(dtype)
    notes: list[str] = []
    if context > c.max_len:
        notes.append(f"context {context} exceeds the model's max_len={c.max_len}")
    if c.arch == "encoder":
        notes.append("encoder-only: no KV cache")
    if c.arch == "encoder-decoder":
        notes.append(
            "encoder-decoder: a token is one source plus one target token (equal lengths);"
            " the cross-attention K/V are for a source of `context` tokens"
        )
    breakdown = parameter_breakdown(c)
    n = breakdown.total
    train = training_flops_per_token(c, context)
    return CostReport(
        name=name,
        arch=c.arch,
        context=context,
        batch=batch,
        dtype=dtype,
        dtype_bytes=size,
        parameters=n,
        breakdown=breakdown,
        matmul_parameters=matmul_parameters(c),
        weight_bytes=n * size,
        training_flops_per_token=train,
        forward_flops_per_token=forward_flops_per_token(c, context),
        training_flops_per_step=train * context * batch,
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(c, size),
        kv_cached_positions=0 if c.arch == "encoder" else kv_cached_positions(c, context),
        kv_cache_bytes=kv_cache_bytes(c, context, batch, size),
        recurrent_state_bytes=recurrent_state_bytes(c, batch),
        cross_kv_cache_bytes=cross_kv_cache_bytes(c, context, batch, size),
        attention_sublayers=_attention_sublayers(c),
        attention_score_bytes=attention_score_bytes(c, context, batch, size),
        decoding_bytes_per_token={
            p: decoding_bytes_per_token(c, context, p) for p in DECODING_PRECISIONS
        }
        if c.arch != "encoder"
        else {},
        notes=tuple(notes),
    )


def _scaled(value: float, step: float, units: list[str]) -> str:
    i = 0
    while abs(value) >= step and i < len(units) - 1:
        value /= step
        i += 1
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{text} {units[i]}"


def format_bytes(n: int) -> str:
    """Binary units: ``format_bytes(327680) == "320 KiB"``."""
    return _scaled(n, 1024, ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"])


def format_count(n: int) -> str:
    """Parameters: ``format_count(70_553_706_496) == "70.55B"``."""
    return _scaled(n, 1000, ["", "K", "M", "B", "T"]).replace(" ", "")


def format_flops(n: int) -> str:
    return _scaled(n, 1000, ["FLOPs", "KFLOPs", "MFLOPs", "GFLOPs", "TFLOPs", "PFLOPs", "EFLOPs"])


def format_cost_report(report: CostReport) -> str:
    r, b = report, report.breakdown
    lines = [
        f"{r.name} ({r.arch}): context {r.context:,}, batch {r.batch}, {r.dtype}"
        f" ({r.dtype_bytes} bytes per element)",
        f"  parameters           {format_count(r.parameters):>10}  ({r.parameters:,})",
    ]
    for part in ("embeddings", "attention", "feed_forward", "norms", "head"):
        n = getattr(b, part)
        lines.append(f"    {part:<18} {format_count(n):>10}  ({n:,})")
    lines += [
        f"  weights              {format_bytes(r.weight_bytes):>10}",
        f"  training FLOPs/token {format_flops(r.training_flops_per_token):>10}"
        f"  (6 x {format_count(r.matmul_parameters)} matmul parameters + attention;"
        f" forward {format_flops(r.forward_flops_per_token)})",
        f"  training FLOPs/step  {format_flops(r.training_flops_per_step):>10}"
        f"  ({r.batch} x {r.context:,} tokens)",
    ]
    if r.arch == "encoder":
        lines.append("  KV cache             n/a (encoder-only)")
    else:
        lines += [
            f"  KV cache per token   {format_bytes(r.kv_cache_bytes_per_token):>10}"
            f"  ({r.kv_cache_bytes_per_token:,} bytes)",
            f"  KV cache             {format_bytes(r.kv_cache_bytes):>10}"
            f"  ({r.kv_cached_positions:,} positions x batch {r.batch})",
        ]
        if r.recurrent_state_bytes:
            lines.append(
                f"    of which states    {format_bytes(r.recurrent_state_bytes):>10}"
                "  (linear-attention and state-space layers: fixed, whatever the context)"
            )
    if r.arch == "encoder-decoder":
        lines.append(f"  cross-attention K/V  {format_bytes(r.cross_kv_cache_bytes):>10}")
    lines.append(
        f"  attention scores     {format_bytes(r.attention_score_bytes):>10}  per sublayer"
        f" (x{r.attention_sublayers}) with the reference backend; sdpa/flash avoid them"
    )
    if r.decoding_bytes_per_token:
        lines.append(f"  decoding at batch 1, read per token after {r.context:,} tokens:")
        lines += [
            f"    {p:<22} {format_bytes(n):>10}" for p, n in r.decoding_bytes_per_token.items()
        ]
    lines += [f"  note: {note}" for note in r.notes]
    return "\n".join(lines)


def resolve_calc_config(
    spec: str, overrides: dict[str, Any] | None = None
) -> tuple[str, ModelConfig]:
    """A preset name, a config JSON file, or a saved model's folder (its config.json) ->
    (name, config) with ``overrides`` applied."""
    overrides = overrides or {}
    if spec in presets():
        return spec, get_preset(spec, **overrides)
    path = Path(spec)
    if path.is_dir() and (path / CONFIG_FILE).is_file():
        return path.name, read_config(path).replace(**overrides)
    if path.is_file():
        name = path.parent.name if path.name == CONFIG_FILE else path.stem
        return name, ModelConfig.from_json(path.read_text()).replace(**overrides)
    raise UserError(
        f"{spec!r} is neither a preset ({', '.join(presets())}) nor a model config JSON file"
    )
