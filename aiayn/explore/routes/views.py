"""The views of a configured model: ``GET /api/models`` lists them (names only: a request
never names a file); ``POST /api/attention``, ``/api/next-token``, ``/api/translate`` and
``/api/image`` compute one (aiayn/explore/analysis.py)."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter

from aiayn.config import presets
from aiayn.explore import analysis
from aiayn.explore.registry import Registry
from aiayn.explore.requests import (
    AttentionRequest,
    ImageRequest,
    NextTokenRequest,
    TranslateRequest,
)
from aiayn.inspect import teaching


def router(registry: Registry, max_chars: int) -> APIRouter:
    """The views over ``registry``'s models; a text over ``max_chars`` characters is a 413.
    One model computation runs at a time: the CPU has few cores."""
    routes = APIRouter()
    compute = threading.Lock()

    def check_text(*texts: str | None) -> None:
        for text in texts:
            if text is not None and len(text) > max_chars:
                raise analysis.TooLong(
                    f"the text is {len(text)} characters; this server accepts at most {max_chars}"
                )

    @routes.get("/api/models")
    def models() -> dict[str, Any]:
        return {
            "models": registry.describe(),
            "max_chars": max_chars,
            "presets": presets(),
            "lesson_tokens": [t for t, _, _ in teaching.SENTENCE],
        }

    @routes.post("/api/attention")
    def attention(req: AttentionRequest) -> dict[str, Any]:
        check_text(req.text, req.target)
        loaded = registry.get(req.model)
        with compute:
            return analysis.attention_view(
                loaded,
                req.text,
                target=req.target,
                stream=req.stream,
                layer=req.layer,
                head=req.head,
                temperature=req.temperature,
                causal=req.causal,
            )

    @routes.post("/api/next-token")
    def next_token(req: NextTokenRequest) -> dict[str, Any]:
        check_text(req.text)
        loaded = registry.get(req.model)
        with compute:
            return analysis.next_token(loaded, req.text, temperature=req.temperature, top=req.top)

    @routes.post("/api/translate")
    def translate(req: TranslateRequest) -> dict[str, Any]:
        check_text(req.text)
        loaded = registry.get(req.model)
        with compute:
            return analysis.translation(loaded, req.text, beam_size=req.beam_size)

    @routes.post("/api/image")
    def image(req: ImageRequest) -> dict[str, Any]:
        loaded = registry.get(req.model)
        with compute:
            return analysis.image_view(loaded, req.index, head=req.head)

    return routes
