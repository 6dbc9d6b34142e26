"""``GET /health`` and ``GET /metrics``: what a load balancer and Prometheus probe (open even
with an API key, aiayn/serve/auth.py)."""

from __future__ import annotations

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
        body = {"status": "ok" if running else "stopped", "model": served.name,
                "kind": type(model).__name__, "max_len": served.max_len}  # fmt: skip
        return JSONResponse(body, status_code=200 if running else 503)

    @routes.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return prometheus_text(engine, served.translator)

    return routes


def prometheus_text(engine: Engine | None, translator: Translator | None) -> str:
    """``GET /metrics``: the engine's (or the translator's) counters and gauges, in
    Prometheus' text format."""
    lines = []

    def metric(key: str, kind: str, help_: str, value: float) -> None:
        # Exact: counters past a million must still show every increment (``rate()``).
        text = str(value) if isinstance(value, int) else repr(float(value))
        lines.extend([f"# HELP aiayn_{key} {help_}", f"# TYPE aiayn_{key} {kind}",
                      f"aiayn_{key} {text}"])  # fmt: skip

    if translator is not None:
        t = translator.stats
        metric("requests_total", "counter", "Translation requests accepted.", t["requests"])
        metric("requests_rejected_total", "counter", "Requests refused: queue full (429).",
               t["rejected"])  # fmt: skip
        metric("requests_failed_total", "counter", "Requests that failed (4xx, 5xx).",
               t["failed"])  # fmt: skip
        metric(
            "requests_cancelled_total",
            "counter",
            "Requests whose client left; their decoding stopped at its next step.",
            t["cancelled"],
        )
        metric("lines_translated_total", "counter", "Lines translated.", t["lines"])
        metric("queue_depth", "gauge", "Requests waiting for or in translation.",
               translator.waiting)  # fmt: skip
    if engine is None:
        return "\n".join(lines) + "\n"
    g, s = engine.gauges(), engine.stats
    metric("requests_total", "counter", "Completion requests accepted.", s["requests"])
    for reason in ("stop", "length", "cancelled", "error"):
        metric(f"requests_finished_{reason}_total", "counter",
               f"Requests finished with reason {reason}.", s[f"finished_{reason}"])  # fmt: skip
    metric("tokens_generated_total", "counter", "Tokens generated.", s["tokens"])
    metric("tokens_per_second", "gauge", "Tokens generated per second, last 10 s.",
           g["tokens_per_second"])  # fmt: skip
    metric("queue_depth", "gauge", "Requests waiting for a row.", g["queue_depth"])
    metric("running_batch_size", "gauge", "Requests decoding together.", g["running"])
    metric("cache_slots_in_use", "gauge", "KV-cache rows held by requests.", g["slots_in_use"])
    metric("cache_slots_total", "gauge", "KV-cache rows in the pool.", g["slots_total"])
    return "\n".join(lines) + "\n"
