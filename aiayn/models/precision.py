"""The precision a model decodes in: its float dtype, int8 weights, and its KV cache's dtype.

Decoding at batch 1 is bound by the bytes it reads per token: every weight once, and every
cached key and value.  Three settings trade them against accuracy, each measured on the
README's models (docs/performance.md): ``dtype`` (fp32, or bf16 on CPUs with bf16 units: half
the bytes), ``quantize="int8"`` (the linear layers' weights in int8 with one scale per output
channel, aiayn/nn/quantized.py: a quarter of fp32's bytes; activations stay in ``dtype``), and
``kv_cache`` (the dtype keys and values are kept in; attention then runs in it).

Which kernel runs each product at that precision is not chosen here but where every CPU
kernel is chosen, on entering a block of decoding (aiayn/nn/cpu_kernels.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from aiayn.device import inference_dtype
from aiayn.errors import UserError
from aiayn.models.base import TransformerModel
from aiayn.nn.quantized import quantize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    """``dtype``: "auto" (the device's inference dtype: aiayn.device.inference_dtype),
    "float32" or "bfloat16"; ``quantize``: None or "int8"; ``kv_cache``: None (the model's
    dtype), "float32" or "bfloat16"."""

    dtype: str = "auto"
    quantize: str | None = None
    kv_cache: str | None = None

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise UserError(f"dtype={self.dtype!r} is invalid: expected auto, float32 or bfloat16")
        if self.quantize not in (None, "int8"):
            raise UserError(f"quantize={self.quantize!r} is invalid: expected int8 (or none)")
        if self.kv_cache is not None and self.kv_cache not in DTYPES:
            raise UserError(f"kv_cache={self.kv_cache!r} is invalid: expected float32 or bfloat16")


def apply_precision(
    model: TransformerModel, device: torch.device, precision: Precision = Precision()
) -> TransformerModel:
    """``model`` on ``device`` in ``precision``, in evaluation mode, ready to decode: quantized
    first (from its fp32 weights) when asked and not already, then cast to the dtype.  int8
    weights stay int8 and their scales fp32; biases, norms and embeddings take the dtype."""
    if precision.quantize == "int8" and model.config.quantization != "int8":
        model.to(device, torch.float32)
        quantize(model)
    dtype = inference_dtype(device) if precision.dtype == "auto" else DTYPES[precision.dtype]
    model.to(device, dtype)  # int8 layers keep their scales fp32 (Int8Linear._apply)
    model.cache_dtype = None if precision.kv_cache is None else DTYPES[precision.kv_cache]
    return model.eval()
