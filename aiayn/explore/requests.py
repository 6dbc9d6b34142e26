"""The JSON bodies the explorer's endpoints take, each checked by pydantic (a value out of
range is a 422; an unknown key too)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from aiayn.inspect import teaching


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
