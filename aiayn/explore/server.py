"""``aiayn explore``: a FastAPI app that serves the explorer page and its JSON API.

The page (``static/``) draws with Plotly.js, served from the ``plotly`` Python package's own
copy, so the explorer works offline.  Every number it shows comes from the endpoints below,
which call the library:

========================  ======================================================================
``GET /api/models``       the configured models (names only: a request never names a file)
``POST /api/attention``   one layer's attention, re-weighted at a temperature, causal or not
``POST /api/next-token``  a language model's next-token distribution
``POST /api/translate``   a translation (beam search) for the alignment view
``POST /api/lesson/*``    the teaching views: ``query``, ``lookup``, ``positions``, ``kv-cache``
========================  ======================================================================

Bad requests get a 4xx answer with ``{"error": "..."}`` naming what was wrong, and the server
keeps serving: 400 malformed JSON (too deeply nested included) or a model named by a path, 404
an unknown model or path, 405 a wrong method, 413 a body over ``max_body`` bytes (refused from
its Content-Length, or as soon as a chunked body passes the limit, before it is read) or text
over the limit (characters, or the model's tokens), 422 a value out of range.  Anything
unexpected is a 500 with ``{"error": ...}`` too.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aiayn.config import get_preset, presets
from aiayn.explore import analysis
from aiayn.explore.registry import PathNotAllowed, Registry, UnknownModel
from aiayn.inspect import calc, teaching

STATIC = Path(__file__).parent / "static"
DEFAULT_MAX_CHARS = 400
DEFAULT_MAX_BODY = 64 * 1024  # bytes of a request body


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` is refused with 413 before it is read
    -- at once from its Content-Length, or as soon as a chunked body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send, declared.decode(errors="replace"))
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(
                        413,
                        f"the request body is more than {self.max_bytes} bytes;"
                        f" this server accepts at most {self.max_bytes}",
                    )
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send, f"more than {self.max_bytes}")

    async def _refuse(self, send: Send, size: str) -> None:
        response = _error(
            413, f"the request body is {size} bytes; this server accepts at most {self.max_bytes}"
        )
        await response({"type": "http"}, _no_body, send)


class _TooLarge(HTTPException):
    """Raised while reading a body that passes the limit; FastAPI passes HTTPExceptions
    through its body parsing, so the handler answers 413 with this message."""


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


Temperature = Annotated[float, Field(gt=0.0, le=100.0)]


class AttentionRequest(Strict):
    model: str
    text: str
    target: str | None = None
    stream: Literal["self", "encoder", "decoder", "cross"] | None = None
    layer: Annotated[int, Field(ge=0)] = 0
    head: Annotated[int, Field(ge=0)] | None = None
    temperature: Temperature = 1.0
    causal: bool | None = None


class NextTokenRequest(Strict):
    model: str
    text: str
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    top: Annotated[int, Field(ge=1, le=100)] = 15


class TranslateRequest(Strict):
    model: str
    text: str
    beam_size: Annotated[int, Field(ge=1, le=16)] = 4


class QueryLesson(Strict):
    query: Annotated[int, Field(ge=0)] = teaching.PRONOUN
    scale: bool = True


class LookupLesson(Strict):
    between: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    length: Annotated[float, Field(ge=0.0, le=20.0)] = 1.0


class KernelLesson(Strict):
    sigma: Annotated[float, Field(ge=0.01, le=10.0)] = 0.3


class ImageRequest(Strict):
    model: str
    index: Annotated[int, Field(ge=0)] = 0
    head: Annotated[int, Field(ge=0)] | None = None


class PositionsLesson(Strict):
    position: Annotated[int, Field(ge=0)] = 20
    max_len: Annotated[int, Field(ge=2, le=2048)] = 100
    d_model: Annotated[int, Field(ge=2, le=4096)] = 128


class KVCacheLesson(Strict):
    preset: str = "gpt2-small"
    n_layers: Annotated[int, Field(ge=1, le=512)] | None = None
    d_model: Annotated[int, Field(ge=1, le=65536)] | None = None
    n_heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    n_kv_heads: Annotated[int, Field(ge=1, le=1024)] | None = None
    context: Annotated[int, Field(ge=1, le=10_000_000)] = 1024
    batch: Annotated[int, Field(ge=1, le=100_000)] = 1
    dtype: Literal["float32", "bfloat16", "float16", "int8", "fp8"] = "bfloat16"
    mixer: Literal["attention", "linear", "ssm"] = "attention"
    attention_every: Annotated[int, Field(ge=1, le=512)] | None = None


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _describe_validation(err: RequestValidationError) -> tuple[int, str]:
    problems = []
    for e in err.errors():
        if e.get("type") == "json_invalid":
            ctx = e.get("ctx", {}).get("error", "")
            return 400, f"malformed JSON: {ctx}".rstrip(": ")
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        if where == "body" and e.get("type") in ("model_attributes_type", "dict_type"):
            return 400, "the body must be a JSON object (send Content-Type: application/json)"
        problems.append(f"{where}: {e.get('msg')}")
    return 422, "; ".join(problems)


def create_app(
    registry: Registry, *, max_chars: int = DEFAULT_MAX_CHARS, max_body: int = DEFAULT_MAX_BODY
) -> FastAPI:
    """The explorer app over ``registry``; texts longer than ``max_chars`` and bodies larger
    than ``max_body`` bytes get a 413."""
    import plotly

    app = FastAPI(title="aiayn explorer", docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, max_bytes=max_body)
    compute = threading.Lock()  # one model computation at a time: the CPU has few cores
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return _error(*_describe_validation(err))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        detail = err.detail if isinstance(err.detail, str) else "bad request"
        if err.status_code == 400 and "parsing the body" in detail:
            detail = "malformed JSON: the body could not be parsed (too deeply nested?)"
        return _error(err.status_code, detail)

    @app.exception_handler(RecursionError)
    async def too_deep(_: Request, err: RecursionError) -> JSONResponse:
        return _error(400, "malformed JSON: nested too deeply")

    @app.exception_handler(Exception)
    async def unexpected(_: Request, err: Exception) -> JSONResponse:
        return _error(500, f"internal error: {type(err).__name__}: {err}")

    @app.exception_handler(PathNotAllowed)
    async def path_like(_: Request, err: PathNotAllowed) -> JSONResponse:
        return _error(400, str(err))

    @app.exception_handler(UnknownModel)
    async def unknown(_: Request, err: UnknownModel) -> JSONResponse:
        return _error(404, str(err.args[0]))

    @app.exception_handler(analysis.TooLong)
    async def too_long(_: Request, err: analysis.TooLong) -> JSONResponse:
        return _error(413, str(err))

    @app.exception_handler(ValueError)
    async def bad_value(_: Request, err: ValueError) -> JSONResponse:
        return _error(422, str(err))

    def check_text(*texts: str | None) -> None:
        for text in texts:
            if text is not None and len(text) > max_chars:
                raise analysis.TooLong(
                    f"the text is {len(text)} characters; this server accepts at most {max_chars}"
                )

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_bundle() -> FileResponse:
        return FileResponse(plotly_js, media_type="text/javascript")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/models")
    def models() -> dict[str, Any]:
        return {
            "models": registry.describe(),
            "max_chars": max_chars,
            "presets": presets(),
            "lesson_tokens": [t for t, _, _ in teaching.SENTENCE],
        }

    @app.post("/api/attention")
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

    @app.post("/api/next-token")
    def next_token(req: NextTokenRequest) -> dict[str, Any]:
        check_text(req.text)
        loaded = registry.get(req.model)
        with compute:
            return analysis.next_token(loaded, req.text, temperature=req.temperature, top=req.top)

    @app.post("/api/translate")
    def translate(req: TranslateRequest) -> dict[str, Any]:
        check_text(req.text)
        loaded = registry.get(req.model)
        with compute:
            return analysis.translation(loaded, req.text, beam_size=req.beam_size)

    @app.post("/api/image")
    def image(req: ImageRequest) -> dict[str, Any]:
        loaded = registry.get(req.model)
        with compute:
            return analysis.image_view(loaded, req.index, head=req.head)

    @app.post("/api/lesson/query")
    def lesson_query(req: QueryLesson) -> dict[str, Any]:
        return teaching.query_walkthrough(req.query, scale=req.scale)

    @app.post("/api/lesson/lookup")
    def lesson_lookup(req: LookupLesson) -> dict[str, Any]:
        return teaching.soft_lookup(req.between, req.length)

    @app.post("/api/lesson/kernel")
    def lesson_kernel(req: KernelLesson) -> dict[str, Any]:
        return teaching.nadaraya_watson(req.sigma)

    @app.post("/api/lesson/positions")
    def lesson_positions(req: PositionsLesson) -> dict[str, Any]:
        sim = teaching.positional_similarity(req.max_len, req.d_model, req.position)
        return {"position": req.position, "similarity": sim}

    @app.post("/api/lesson/kv-cache")
    def lesson_kv_cache(req: KVCacheLesson) -> dict[str, Any]:
        fields = ("n_layers", "d_model", "n_heads", "n_kv_heads", "attention_every")
        overrides = {f: getattr(req, f) for f in fields if getattr(req, f) is not None}
        if req.mixer != "attention":  # the recurrent layers of a decoder (aiayn/nn/)
            overrides["mixer"] = req.mixer
        config = get_preset(req.preset, **overrides)
        report = calc.cost_report(config, req.context, req.batch, req.dtype, name=req.preset)
        data = report.to_dict()
        data["text"] = calc.format_cost_report(report)
        data["kv_cache"] = calc.format_bytes(report.kv_cache_bytes)
        data["kv_cache_per_token"] = calc.format_bytes(report.kv_cache_bytes_per_token)
        data["weights"] = calc.format_bytes(report.weight_bytes)
        data["recurrent_state"] = calc.format_bytes(report.recurrent_state_bytes)
        data["flops_per_token"] = calc.format_flops(report.forward_flops_per_token)
        return data

    return app


def serve(
    registry: Registry,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_body: int = DEFAULT_MAX_BODY,
) -> None:
    """Run the explorer until interrupted."""
    import uvicorn

    app = create_app(registry, max_chars=max_chars, max_body=max_body)
    uvicorn.run(app, host=host, port=port, log_level="info")
