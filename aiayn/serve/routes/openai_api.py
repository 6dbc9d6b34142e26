"""The OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` and ``/v1/embeddings``, each handing its request to the module that
does the work (aiayn/serve/completion.py, chat.py, embeddings.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from aiayn.data.tokenizer import BPETokenizer
from aiayn.serve.chat import ChatBody, chat_completion
from aiayn.serve.completion import Completer
from aiayn.serve.embeddings import EmbeddingBody
from aiayn.serve.errors import APIError, documented_errors
from aiayn.serve.served import ServedModel
from aiayn.serve.text_completion import CompletionBody, text_completion

# A completion is JSON, or with ``stream`` server-sent events: the schema names both.
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The completion (JSON), or with stream: true its server-sent events.",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


def router(served: ServedModel) -> APIRouter:
    """The OpenAI-compatible API over ``served``; a route its model cannot answer is a 400
    naming the one to use."""
    routes = APIRouter(responses=documented_errors())
    model, tokenizer, name = served.model, served.tokenizer, served.name

    @routes.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @routes.get("/v1/models/{model_id}")
    def model_by_id(model_id: str) -> dict[str, Any]:
        if model_id != name:
            raise APIError(404, f"model {model_id!r} is not served here (this server: {name!r})")
        return model_card()

    def model_card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": served.created, "owned_by": "aiayn"}

    def generating() -> Completer:
        if served.completer is not None:
            return served.completer
        use = "POST /v1/translate" if served.translator is not None else "POST /v1/embeddings"
        raise APIError(400, f"{name} is a {type(model).__name__}: use {use}")

    @routes.post("/v1/completions", response_model=None, responses=STREAMED)
    async def completions(body: CompletionBody, http: Request) -> Any:
        return await text_completion(body, http, generating(), name)

    @routes.post("/v1/chat/completions", response_model=None, responses=STREAMED)
    async def chat(body: ChatBody, http: Request) -> Any:
        completer = generating()
        if not isinstance(tokenizer, BPETokenizer):
            raise APIError(400, f"{name} has no chat template: use POST /v1/completions")
        return await chat_completion(body, http, completer, tokenizer, name)

    @routes.post("/v1/embeddings")
    async def embeddings(body: EmbeddingBody, http: Request) -> dict[str, Any]:
        if served.embedder is None:
            kind = type(model).__name__
            raise APIError(400, f"{name} is a {kind}, not an encoder: it gives no embeddings")
        return await served.embedder(body, name, http)

    return routes
