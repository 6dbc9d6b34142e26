"""The teaching views, ``POST /api/lesson/*``: ``query``, ``lookup``, ``kernel``,
``positions`` and ``kv-cache`` (aiayn/inspect/teaching.py, aiayn/inspect/cost_report.py); they
need no model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from aiayn.config import get_preset
from aiayn.explore.requests import (
    KernelLesson,
    KVCacheLesson,
    LookupLesson,
    PositionsLesson,
    QueryLesson,
)
from aiayn.inspect import cost_report, teaching

# The KV-cache lesson's request fields -> the model settings they set.
_KV_LESSON_SETTINGS = {
    "n_layers": "n_layers",
    "d_model": "d_model",
    "n_heads": "attention.n_heads",
    "n_kv_heads": "attention.n_kv_heads",
    "attention_every": "mixer.attention_every",
}


def router() -> APIRouter:
    """The lessons' routes."""
    routes = APIRouter()

    @routes.post("/api/lesson/query")
    def lesson_query(req: QueryLesson) -> dict[str, Any]:
        return teaching.query_walkthrough(req.query, scale=req.scale)

    @routes.post("/api/lesson/lookup")
    def lesson_lookup(req: LookupLesson) -> dict[str, Any]:
        return teaching.soft_lookup(req.between, req.length)

    @routes.post("/api/lesson/kernel")
    def lesson_kernel(req: KernelLesson) -> dict[str, Any]:
        return teaching.nadaraya_watson(req.sigma)

    @routes.post("/api/lesson/positions")
    def lesson_positions(req: PositionsLesson) -> dict[str, Any]:
        sim = teaching.positional_similarity(req.max_len, req.d_model, req.position)
        return {"position": req.position, "similarity": sim}

    @routes.post("/api/lesson/kv-cache")
    def lesson_kv_cache(req: KVCacheLesson) -> dict[str, Any]:
        overrides = {
            setting: getattr(req, field)
            for field, setting in _KV_LESSON_SETTINGS.items()
            if getattr(req, field) is not None
        }
        if req.mixer != "attention":  # the recurrent layers of a decoder (aiayn/nn/)
            overrides["mixer.kind"] = req.mixer
        config = get_preset(req.preset, **overrides)
        report = cost_report.cost_report(config, req.context, req.batch, req.dtype, name=req.preset)
        data = report.to_dict()
        data["text"] = cost_report.format_cost_report(report)
        data["kv_cache"] = cost_report.format_bytes(report.kv_cache_bytes)
        data["kv_cache_per_token"] = cost_report.format_bytes(report.kv_cache_bytes_per_token)
        data["weights"] = cost_report.format_bytes(report.weight_bytes)
        data["recurrent_state"] = cost_report.format_bytes(report.recurrent_state_bytes)
        data["flops_per_token"] = cost_report.format_flops(report.forward_flops_per_token)
        return data

    return routes
