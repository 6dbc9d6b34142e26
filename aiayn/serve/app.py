"""``aiayn serve``: the HTTP face of the engine (aiayn/serve/engine.py), a FastAPI app.

=============================  =================================================================
``POST /v1/completions``       OpenAI-compatible (aiayn/serve/text_completion.py): a prompt
                               or a batch, n, best_of, logprobs, echo, seed, penalties,
                               logit_bias, stop, streaming; suffix is refused with a 400
``POST /v1/chat/completions``  OpenAI-compatible chat over the checkpoint's own chat template
                               (aiayn/serve/chat.py): n, logprobs, streaming too
``POST /tokenize``             vLLM's tokenizer helpers, also ``/detokenize`` and
                               ``/tokenizer_info`` (aiayn/serve/routes/tokens.py)
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

Limits (aiayn/serve/limits.py), each a clear error ``{"error": {"message", "type", "code"}}``
(OpenAI's shape): a body over ``max_body`` bytes is a 413, refused before it is read; a prompt
over ``max_prompt_tokens`` or one that leaves no room in the model's context, ``max_tokens``
over ``max_new_tokens``, or a stop string over ``max_stop_chars`` is a 400; a full queue is a
429 (``max_batch`` requests run at once, ``max_queue`` more wait); an engine that is not
running is a 503; anything unexpected is a 500 that carries no exception text (the log has
it).  Text is tokenized on a worker thread, never on the event loop.  A client that
disconnects -- a closed stream included -- cancels its request: the engine frees its row at
the next step, and a translation or embedding job stops at its next step (aiayn/serve/jobs.py).
With ``api_key``, every request but ``/health`` and ``/metrics`` needs it as a bearer token (a
401 without; aiayn/serve/auth.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from aiayn.data.tokenizer import Tokenizer
from aiayn.interop.generation_config import NONE, GenerationIds
from aiayn.interop.sentence_transformers import DEFAULT_POOLING, Pooling
from aiayn.models import TransformerModel
from aiayn.serve.auth import require_api_key
from aiayn.serve.body_limit import limit_body
from aiayn.serve.errors import error_response, install_error_handlers
from aiayn.serve.limits import DEFAULT_MAX_BODY, MAX_N, MAX_STOP_CHARS
from aiayn.serve.routes import monitoring, openai_api, tokens, translation
from aiayn.serve.served import serve_model


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
    max_body: int = DEFAULT_MAX_BODY,
    max_stop_chars: int = MAX_STOP_CHARS,
    max_n: int = MAX_N,
) -> FastAPI:
    """The app serving ``model``.  Its engine (``app.state.engine``; None for translation and
    embeddings) starts with the app and stops with it, on a thread of its own -- unless
    ``start_engine`` is False: then the caller runs ``engine.run()`` (``aiayn serve`` does, in
    the main thread: aiayn/serve/server.py).  ``context`` is the longest prompt + completion a
    request may have: every KV row of the pool holds that many positions (default: the
    model's max_len, at most 4,096).  ``generation`` holds the checkpoint's end ids
    (generation_config.json), ``pooling`` an encoder's sentence-embedding recipe, ``api_key``
    the bearer token ``/v1/...`` requests must carry, ``max_body`` the largest request body in
    bytes (413 above), ``max_stop_chars`` the longest stop string, ``max_n`` the most choices a
    request may ask for (``n``, ``best_of``, over a batch of prompts).  The routes are the routers
    of aiayn/serve/routes/."""
    served = serve_model(
        model,
        tokenizer,
        name=name,
        max_batch=max_batch,
        max_queue=max_queue,
        max_prompt_tokens=max_prompt_tokens,
        max_new_tokens=max_new_tokens,
        max_stop_chars=max_stop_chars,
        max_n=max_n,
        prefill_chunk=prefill_chunk,
        batching=batching,
        context=context,
        generation=generation,
        pooling=pooling,
    )
    engine = served.engine if start_engine else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if engine is not None:
            engine.start()
        yield
        if engine is not None:
            engine.stop()

    app = FastAPI(title="aiayn serve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.engine, app.state.served = served.engine, served
    if api_key is not None:
        require_api_key(app, api_key)
    install_error_handlers(app)
    limit_body(app, max_body, error_response)
    for routes in (monitoring, openai_api, tokens, translation):
        app.include_router(routes.router(served))
    return app
