"""``POST /v1/translate``: an encoder-decoder's translations (aiayn/serve/translator.py):
``text`` a string or a list of lines, ``beam`` the beam size (1 = greedy)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from aiayn.errors import UserError
from aiayn.serve.errors import APIError, documented_errors
from aiayn.serve.served import ServedModel


class TranslateBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str | list[str]
    beam: Annotated[int, Field(ge=1, le=16)] = 4


def router(served: ServedModel) -> APIRouter:
    """The translation route over ``served``: at most ``4 * max_batch`` lines a request; a
    model that does not translate is a 400 naming the route to use."""
    routes = APIRouter(responses=documented_errors())
    name, kind = served.name, type(served.model).__name__

    @routes.post("/v1/translate")
    async def translate_endpoint(body: TranslateBody, http: Request) -> dict[str, Any]:
        if served.translator is None:
            use = "POST /v1/embeddings" if served.embedder is not None else "POST /v1/completions"
            raise APIError(400, f"{name} is a {kind}: use {use}")
        lines = [body.text] if isinstance(body.text, str) else body.text
        if not 1 <= len(lines) <= served.max_batch * 4:
            raise APIError(400, f"text: 1 to {served.max_batch * 4} lines per request")
        try:
            out = await served.translator(lines, body.beam, http)
        except UserError as err:  # a line over the model's length
            raise APIError(400, str(err)) from err
        return {"model": name, "translations": out if isinstance(body.text, list) else out[0]}

    return routes
