"""aiayn -- "Attention Is All You Need", complete, correct and visible.

The public API:

>>> import aiayn
>>> model = aiayn.build_model("paper-base", n_layers=2)
>>> model.num_parameters()
>>> aiayn.save(model, "out/model"); model = aiayn.load_model("out/model")
>>> bundle = aiayn.load("runs/multi30k")  # a checkpoint, a run or an HF folder
>>> bundle.model, bundle.tokenizer, bundle.run
>>> aiayn.scaled_dot_product_attention(q, k, v, mask, is_causal=True)
>>> result = aiayn.train("configs/shakespeare_char.toml", "runs/char")  # aiayn train
>>> aiayn.evaluate("runs/char").scores  # aiayn evaluate: {"loss": ..., "perplexity": ...}

The names are imported on first use (PEP 562), so that ``import aiayn.cli`` -- and with it
``aiayn --help`` -- does not pay for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiayn.checkpoint import Bundle, load, load_model, save
    from aiayn.config import ModelConfig, get_preset, presets
    from aiayn.evaluation.entry import evaluate
    from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM, TransformerModel, build_model
    from aiayn.nn.attention import scaled_dot_product_attention
    from aiayn.nn.cache import Cache, KVCache
    from aiayn.training.entry import train

__version__ = "0.1.0"

# Each public name and the module it is read from.
_HOME = {
    "Bundle": "aiayn.checkpoint",
    "load": "aiayn.checkpoint",
    "load_model": "aiayn.checkpoint",
    "save": "aiayn.checkpoint",
    "ModelConfig": "aiayn.config",
    "get_preset": "aiayn.config",
    "presets": "aiayn.config",
    "DecoderLM": "aiayn.models",
    "EncoderDecoder": "aiayn.models",
    "EncoderLM": "aiayn.models",
    "TransformerModel": "aiayn.models",
    "build_model": "aiayn.models",
    "scaled_dot_product_attention": "aiayn.nn.attention",
    "Cache": "aiayn.nn.cache",
    "KVCache": "aiayn.nn.cache",
    "train": "aiayn.training.entry",
    "evaluate": "aiayn.evaluation.entry",
}

__all__ = [
    "Bundle",
    "Cache",
    "DecoderLM",
    "EncoderDecoder",
    "EncoderLM",
    "KVCache",
    "ModelConfig",
    "TransformerModel",
    "build_model",
    "evaluate",
    "get_preset",
    "load",
    "load_model",
    "presets",
    "save",
    "scaled_dot_product_attention",
    "train",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
