"""``aiayn serve``: the HTTP face of the engine (aiayn/serve/engine.py), a FastAPI app.

=============================  =================================================================
``POST /v1/completions``       OpenAI-compatible: prompt (text or token ids), max_tokens,
                               temperature, top_p, top_k, stop, seed, stream (server-sent
                               events, ending ``data: [DONE]``; ``stream_options.include_usage``
                               adds OpenAI's closing usage chunk); logprobs, echo, suffix and
                               best_of > 1 are refused with a 400 rather than ignored
``POST /v1/chat/completions``  OpenAI-compatible chat over the checkpoint's own chat template
                               (aiayn/serve/chat.py), streaming too
``POST /v1/embeddings``        encoder checkpoints: OpenAI-compatible sentence embeddings
                               (aiayn/serve/embeddings.py)
``GET /v1/models``             the one model served (also ``/v1/models/{id}``)
``POST /v1/translate``         encoder-decoder checkpoints: ``text`` (a string or a list),
                               ``beam`` (1 = greedy)
``GET /health``                the model and whether the engine runs (503 once it has stopped)
``GET /metrics``               Prometheus text: requests, tokens, tokens/s, queue depth, running
                               batch size, cache slots in use (translation: requests, refused
                               and failed requests, lines, queue depth)
=============================  =================================================================

Limits, each a clear error ``{"error": {"message", "type", "code"}}`` (OpenAI's shape): a prompt
over ``max_prompt_tokens`` or one that leaves no room in the model's context, or ``max_tokens``
over ``max_new_tokens``, is a 400; a full queue is a 429 (``max_batch`` requests run at once,
``max_queue`` more wait); an engine that is not running is a 503.  A client that disconnects
-- a closed stream included -- cancels its request, and the engine frees its row at the next
step.  With ``api_key``, every ``/v1/...`` request needs it as a bearer token (a 401 without;
aiayn/serve/auth.py).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer, Tokenizer
from aiayn.generate.beam import BeamConfig
from aiayn.generate.chat import end_ids
from aiayn.generate.translate import translate
from aiayn.interop.generation_config import NONE, GenerationIds
from aiayn.interop.sentence_transformers import DEFAULT_POOLING, Pooling
from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM, TransformerModel
from aiayn.serve.auth import require_api_key
from aiayn.serve.chat import ChatBody, chat_completion
from aiayn.serve.completion import Completer, CompletionBody, text_completion
from aiayn.serve.embeddings import Embedder, EmbeddingBody
from aiayn.serve.engine import Engine, EngineStopped, QueueFull
from aiayn.serve.errors import APIError, error_response

EOS_TOKENS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")


class TranslateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str | list[str]
    beam: Annotated[int, Field(ge=1, le=16)] = 4


def eos_id(tokenizer: Tokenizer) -> int | None:
    """The end-of-text token of a BPE tokenizer that has one (GPT-2's ``<|endoftext|>``, ...)."""
    if not isinstance(tokenizer, BPETokenizer):
        return None
    for name in EOS_TOKENS:
        found = tokenizer.tok.token_to_id(name)
        if found is not None:
            return int(found)
    return None


def stop_ids(tokenizer: Tokenizer, generation: GenerationIds) -> tuple[int, ...]:
    """The ids that end a request: the checkpoint's own (generation_config.json's EOS ids, the
    tokenizer's ``eos_token``), else an end-of-text token found by name (:func:`eos_id`)."""
    if isinstance(tokenizer, BPETokenizer):
        named = end_ids(tokenizer, generation)
        if named:
            return named
    guessed = eos_id(tokenizer)
    return () if guessed is None else (guessed,)


class _Translator:
    """Translation requests, each a batch of lines through beam search (or greedy), one batch
    at a time on a worker thread; at most ``max_queue`` wait."""

    def __init__(
        self,
        model: EncoderDecoder,
        tokenizer: BPETokenizer | MarianTokenizer,
        max_queue: int,
        generation: GenerationIds = NONE,
    ) -> None:
        self.model, self.tokenizer, self.max_queue = model, tokenizer, max_queue
        self.generation = generation  # the folder's decoder start / end / padding ids
        self.count, self.busy, self.waiting = threading.Lock(), threading.Lock(), 0
        self.stats = collections.Counter[str]()  # what /metrics reports

    async def __call__(self, lines: list[str], beam: int) -> list[str]:
        with self.count:
            if self.waiting > self.max_queue:
                self.stats["rejected"] += 1
                raise QueueFull(f"{self.waiting} translations are queued (max_queue)")
            self.waiting += 1
            self.stats["requests"] += 1
        try:
            config = None if beam == 1 else BeamConfig(beam_size=beam)
            out = await asyncio.to_thread(self._run, lines, config)
            with self.count:
                self.stats["lines"] += len(lines)
            return out
        except Exception:
            with self.count:
                self.stats["failed"] += 1
            raise
        finally:
            with self.count:
                self.waiting -= 1

    def _run(self, lines: list[str], config: BeamConfig | None) -> list[str]:
        with self.busy, torch.inference_mode():
            return translate(
                self.model, self.tokenizer, lines, beam=config, generation=self.generation
            )


def _context(model_max_len: int, context: int | None, **limits: int | None) -> int:
    """The context every request shares (at most 4,096 by default), once the server's limits
    are checked: each a clear error naming the setting."""
    unset = " (or unset: the context)"
    for key, value in limits.items():
        least = 0 if key == "max_queue" else 1
        note = unset if key in ("max_prompt_tokens", "max_new_tokens") else ""
        if value is not None and value < least:
            raise ValueError(f"{key}={value}: expected at least {least}{note}")
    if context is not None and not 2 <= context <= model_max_len:
        raise ValueError(f"context={context}: expected 2 to the model's max_len={model_max_len}")
    return min(model_max_len, context or 4096)


def _install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape, with the status that says what went wrong."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> JSONResponse:
        return error_response(err.status, err.message, err.kind)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        problems = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in err.errors()
        ]
        return error_response(400, "; ".join(problems))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, err: HTTPException) -> JSONResponse:
        return error_response(err.status_code, str(err.detail))

    @app.exception_handler(QueueFull)
    async def busy(_: Request, err: QueueFull) -> JSONResponse:
        return error_response(429, f"the server is busy: {err}", "rate_limit_error")

    @app.exception_handler(EngineStopped)
    async def stopped(_: Request, err: EngineStopped) -> JSONResponse:
        return error_response(503, str(err), "server_error")


def prometheus_text(engine: Engine | None, translator: _Translator | None) -> str:
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


def _worker(
    model: TransformerModel, tokenizer: Tokenizer, *, max_batch: int, max_queue: int,
    prefill_chunk: int, batching: bool, context: int, generation: GenerationIds, pooling: Pooling,
) -> tuple[Engine | None, _Translator | None, Embedder | None]:  # fmt: skip
    """What answers the requests: the generation engine of a decoder-only model, the
    translator of an encoder-decoder, or the embedder of an encoder (the others are None)."""
    if isinstance(model, DecoderLM):
        return (
            Engine(
                model,
                tokenizer.decode,
                max_batch=max_batch,
                max_queue=max_queue,
                prefill_chunk=prefill_chunk,
                eos_id=stop_ids(tokenizer, generation),
                batching=batching,
                context=context,
            ),
            None,
            None,
        )
    if isinstance(model, EncoderDecoder) and isinstance(tokenizer, BPETokenizer | MarianTokenizer):
        return None, _Translator(model, tokenizer, max_queue, generation), None
    if isinstance(model, EncoderLM) and model.config.image_size is None:
        return None, None, Embedder(model, tokenizer, pooling, max_queue)
    raise ValueError(f"a {type(model).__name__} cannot be served: it does not generate text")


def create_app(
    model: TransformerModel,
    tokenizer: Tokenizer,
    *,
    name: str = "aiayn",
    max_batch: int = 16,
    max_queue: int = 64,
    max_prompt_tokens: int | None = None,
    max_new_tokens: int | None = None,
    prefill_chunk: int = 128,
    batching: bool = True,
    start_engine: bool = True,
    context: int | None = None,
    generation: GenerationIds = NONE,
    pooling: Pooling = DEFAULT_POOLING,
    api_key: str | None = None,
) -> FastAPI:
    """The app serving ``model``.  Its engine (``app.state.engine``; None for translation and
    embeddings) starts with the app and stops with it, on a thread of its own -- unless
    ``start_engine`` is False: then the caller runs ``engine.run()`` (``aiayn serve`` does, in
    the main thread).  ``context`` is the longest prompt + completion a request may have:
    every KV row of the pool holds that many positions (default: the model's max_len, at most
    4,096).  ``generation`` holds the checkpoint's end ids (generation_config.json),
    ``pooling`` an encoder's sentence-embedding recipe, ``api_key`` the bearer token
    ``/v1/...`` requests must carry.

    Its body is the table of routes (longer than most functions here for that reason): each
    a few lines handing the request to the module that does the work -- completion.py,
    chat.py, embeddings.py, the translator -- so that one reading shows the whole API."""
    max_len = _context(model.config.max_len, context, max_batch=max_batch, max_queue=max_queue,
                       prefill_chunk=prefill_chunk, max_prompt_tokens=max_prompt_tokens,
                       max_new_tokens=max_new_tokens)  # fmt: skip
    engine, translator, embedder = _worker(
        model, tokenizer, max_batch=max_batch, max_queue=max_queue, prefill_chunk=prefill_chunk,
        batching=batching, context=max_len, generation=generation, pooling=pooling,
    )  # fmt: skip
    prompt_limit = max_len - 1 if max_prompt_tokens is None else min(max_prompt_tokens, max_len - 1)
    new_limit = max_len if max_new_tokens is None else max_new_tokens

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if engine is not None and start_engine:
            engine.start()
        yield
        if engine is not None and start_engine:
            engine.stop()

    app = FastAPI(title="aiayn serve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.engine = engine
    if api_key is not None:
        require_api_key(app, api_key)
    completer = None if engine is None else Completer(
        engine, model.config.vocab_size, max_len, prompt_limit, new_limit)  # fmt: skip
    created = int(time.time())

    _install_error_handlers(app)

    @app.get("/health")
    def health() -> JSONResponse:
        """200 while requests are taken; 503 once the engine has stopped or failed, so that a
        load balancer's or Kubernetes' probe, which reads the status code, stops sending."""
        running = engine.accepting if engine is not None else True
        body = {"status": "ok" if running else "stopped", "model": name,
                "kind": type(model).__name__, "max_len": max_len}  # fmt: skip
        return JSONResponse(body, status_code=200 if running else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return prometheus_text(engine, translator)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id}")
    def model_by_id(model_id: str) -> dict[str, Any]:
        if model_id != name:
            raise APIError(404, f"model {model_id!r} is not served here (this server: {name!r})")
        return model_card()

    def model_card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "aiayn"}

    def generating() -> Completer:
        if completer is not None:
            return completer
        use = "POST /v1/translate" if translator is not None else "POST /v1/embeddings"
        raise APIError(400, f"{name} is a {type(model).__name__}: use {use}")

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionBody, http: Request) -> Any:
        return await text_completion(body, http, generating(), tokenizer, name)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatBody, http: Request) -> Any:
        completer = generating()
        if not isinstance(tokenizer, BPETokenizer):
            raise APIError(400, f"{name} has no chat template: use POST /v1/completions")
        return await chat_completion(body, http, completer, tokenizer, name)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingBody) -> dict[str, Any]:
        if embedder is None:
            raise APIError(400, f"{name} is a {type(model).__name__}, not an encoder: it gives"
                                " no embeddings")  # fmt: skip
        return await embedder(body, name)

    @app.post("/v1/translate")
    async def translate_endpoint(body: TranslateBody) -> dict[str, Any]:
        if translator is None:
            use = "POST /v1/embeddings" if embedder is not None else "POST /v1/completions"
            raise APIError(400, f"{name} is a {type(model).__name__}: use {use}")
        lines = [body.text] if isinstance(body.text, str) else body.text
        if not 1 <= len(lines) <= max_batch * 4:
            raise APIError(400, f"text: 1 to {max_batch * 4} lines per request")
        try:
            out = await translator(lines, body.beam)
        except ValueError as err:  # a line over the model's length
            raise APIError(400, str(err)) from err
        return {"model": name, "translations": out if isinstance(body.text, list) else out[0]}

    return app
