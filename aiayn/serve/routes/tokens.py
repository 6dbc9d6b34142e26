"""vLLM's tokenizer helpers: ``POST /tokenize``, ``POST /detokenize`` and
``GET /tokenizer_info``, so that a client counts tokens with the served tokenizer itself.

lm-evaluation-harness's ``local-completions`` finds them and tokenizes through them
(``tokenizer_backend=remote``): its prompts are then the server's own token ids.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from aiayn.data.tokenizer import BPETokenizer
from aiayn.errors import UserError
from aiayn.serve.errors import APIError, documented_errors
from aiayn.serve.served import ServedModel


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def router(served: ServedModel) -> APIRouter:
    """The tokenizer routes over ``served``'s tokenizer."""
    routes = APIRouter(responses=documented_errors())
    tokenizer, vocab = served.tokenizer, served.model.config.vocab_size

    @routes.post("/tokenize")
    async def tokenize(body: TokenizeBody) -> dict[str, Any]:
        """The prompt's ids.  ``add_special_tokens: false`` leaves out what the tokenizer's
        post-processor adds (a BOS, BERT's [CLS] and [SEP])."""
        try:
            ids = await asyncio.to_thread(_encode, tokenizer, body.prompt, body.add_special_tokens)
        except UserError as err:
            raise APIError(400, f"prompt: {err}") from None
        return {"tokens": ids, "count": len(ids), "max_model_len": served.max_len}

    @routes.post("/detokenize")
    async def detokenize(body: DetokenizeBody) -> dict[str, Any]:
        bad = [i for i in body.tokens if i >= vocab]
        if bad:
            raise APIError(400, f"tokens: {bad[0]} is outside the vocabulary (0 to {vocab - 1})")
        return {"prompt": await asyncio.to_thread(tokenizer.decode, body.tokens)}

    @routes.get("/tokenizer_info")
    def tokenizer_info() -> dict[str, Any]:
        """The special tokens and the chat template, as vLLM reports them."""
        special = tokenizer.special_tokens if isinstance(tokenizer, BPETokenizer) else {}
        template = tokenizer.chat_template if isinstance(tokenizer, BPETokenizer) else None
        return {
            "eos_token": special.get("eos_token"),
            "bos_token": special.get("bos_token"),
            "pad_token": special.get("pad_token"),
            "chat_template": template,
            "model_max_length": served.max_len,
            "vocab_size": vocab,
        }

    return routes


def _encode(tokenizer: Any, text: str, special: bool) -> list[int]:
    if not special and isinstance(tokenizer, BPETokenizer):
        return list(tokenizer.tok.encode(text, add_special_tokens=False).ids)
    return list(tokenizer.encode(text))
