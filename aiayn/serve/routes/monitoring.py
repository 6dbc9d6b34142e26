"""``GET /health`` and ``GET /metrics``: what a load balancer and Prometheus probe (open even
with an API key, aiayn/serve/auth.py)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from aiayn.serve.engine import Engine
from aiayn.serve.errors import documented_errors
from aiayn.serve.served import ServedModel
from aiayn.serve.translator import Translator


def router(served: ServedModel) -> APIRouter:
    """The probes of ``served``."""
    routes = APIRouter(responses=documented_errors())
    engine, model = served.engine, served.model

    @routes.get("/health")
    def health() -> JSONResponse:
        """200 while requests are taken; 503 once the engine has stopped or failed, so that a
        load balancer's or Kubernetes' probe, which reads the status code, stops sending."""
        running = engine.accepting if engine is not None else True
        body = {
            "status": "ok" if running else "stopped",
            "model": served.name,
            "kind": type(model).__name__,
            "max_len": served.max_len,
        }
        return JSONResponse(body, status_code=200 if running else 503)

    @routes.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return prometheus_text(engine, served.translator)

    return routes


Metric = Callable[[str, str, str, float], None]  # (name, kind, help, value)


def prometheus_text(engine: Engine | None, translator: Translator | None) -> str:
    """``GET /metrics``: the engine's (or the translator's) counters and gauges, in
    Prometheus' text format."""
    lines: list[str] = []

    def metric(key: str, kind: str, help_: str, value: float) -> None:
        # Exact: counters past a million must still show every increment (``rate()``).
        text = str(value) if isinstance(value, int) else repr(float(value))
        lines.extend([f"# HELP aiayn_{key} {help_}", f"# TYPE aiayn_{key} {kind}"])
        lines.append(f"aiayn_{key} {text}")

    if translator is not None:
        _translation_metrics(translator, metric)
    if engine is not None:
        _engine_metrics(engine, metric)
    return "\n".join(lines) + "\n"


def _translation_metrics(translator: Translator, metric: Metric) -> None:
    t = translator.stats
    metric("requests_total", "counter", "Translation requests accepted.", t["requests"])
    metric(
        "requests_rejected_total", "counter", "Requests refused: queue full (429).", t["rejected"]
    )
    metric("requests_failed_total", "counter", "Requests that failed (4xx, 5xx).", t["failed"])
    metric(
        "requests_cancelled_total",
        "counter",
        "Requests whose client left; their decoding stopped at its next step.",
        t["cancelled"],
    )
    metric("lines_translated_total", "counter", "Lines translated.", t["lines"])
    depth = translator.waiting
    metric("queue_depth", "gauge", "Requests waiting for or in translation.", depth)


def _engine_metrics(engine: Engine, metric: Metric) -> None:
    g, s = engine.gauges(), engine.stats
    metric("requests_total", "counter", "Completion requests accepted.", s["requests"])
    for reason in ("stop", "length", "cancelled", "error"):
        help_ = f"Requests finished with reason {reason}."
        metric(f"requests_finished_{reason}_total", "counter", help_, s[f"finished_{reason}"])
    metric("tokens_generated_total", "counter", "Tokens generated.", s["tokens"])
    rate = g["tokens_per_second"]
    metric("tokens_per_second", "gauge", "Tokens generated per second, last 10 s.", rate)
    metric("queue_depth", "gauge", "Requests waiting for a row.", g["queue_depth"])
    metric("running_batch_size", "gauge", "Requests decoding together.", g["running"])
    metric("cache_slots_in_use", "gauge", "KV-cache rows held by requests.", g["slots_in_use"])
    metric("cache_slots_total", "gauge", "KV-cache rows in the pool.", g["slots_total"])
