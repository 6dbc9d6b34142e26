"""``POST /v1/embeddings``: OpenAI's embeddings API for an encoder (BERT-family) checkpoint.

Each input -- a string, or a list of token ids -- becomes one vector, pooled as the
checkpoint's sentence-transformers recipe says (aiayn/interop/sentence_transformers.py), the
same vectors ``aiayn embed`` writes.  ``encoding_format`` is ``float`` (a JSON list) or
``base64`` (the float32 values' little-endian bytes, which the ``openai`` client asks for by
default and decodes itself).  Requests run one at a time on a worker thread; at most
``max_queue`` wait, and one whose client leaves stops before its next batch.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
import torch
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import RequestError, UserError
from aiayn.generate.cancel import CancelToken
from aiayn.generate.encoder import embed_ids, encode_texts
from aiayn.interop.sentence_transformers import Pooling
from aiayn.models import EncoderLM
from aiayn.serve.errors import APIError
from aiayn.serve.jobs import JobQueue

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request


class EmbeddingBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    user: str | None = None


class Embedder:
    """Embedding requests against one encoder, one at a time on a worker thread
    (aiayn/serve/jobs.py: a bounded queue, and a job that stops when its client leaves)."""

    def __init__(
        self, model: EncoderLM, tokenizer: Tokenizer, pooling: Pooling, max_queue: int
    ) -> None:
        self.model, self.tokenizer, self.pooling = model, tokenizer, pooling
        self.jobs = JobQueue(max_queue, "embedding requests")

    async def __call__(
        self, body: EmbeddingBody, name: str, http: Request | None = None
    ) -> dict[str, Any]:
        inputs = _inputs(body)
        try:
            vectors, tokens = await self.jobs.run(lambda token: self._run(inputs, token), http)
        except UserError as err:  # an empty or over-long input, named by its number
            raise APIError(400, f"input: {err}") from None
        data = [
            {"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": name, "usage": usage}

    def _run(self, inputs: list[Any], token: CancelToken) -> tuple[np.ndarray, int]:
        with torch.inference_mode():
            if all(isinstance(i, str) for i in inputs):  # each text tokenized once
                rows = encode_texts(self.model, self.tokenizer, inputs, pooling=self.pooling)
            elif all(isinstance(i, list) for i in inputs):
                rows = inputs
            else:
                raise RequestError("give texts or lists of token ids, not both")
            vectors = embed_ids(self.model, rows, pooling=self.pooling, cancel=token)
        return vectors.numpy(), sum(len(r) for r in rows)


def _inputs(body: EmbeddingBody) -> list[Any]:
    """The request's inputs as a list (one string or one id list is one input), checked."""
    if body.dimensions is not None:
        raise APIError(
            400,
            f"dimensions={body.dimensions}: this model's vectors are not truncatable; leave it out",
        )
    one = isinstance(body.input, str) or (body.input and isinstance(body.input[0], int))
    inputs: list[Any] = [body.input] if one else list(body.input)
    if not 1 <= len(inputs) <= MAX_INPUTS:
        raise APIError(400, f"input: 1 to {MAX_INPUTS} inputs per request")
    return inputs


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]
