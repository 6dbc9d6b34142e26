"""aiayn -- "Attention Is All You Need", complete, correct and visible.

The public API:

>>> import aiayn
>>> model = aiayn.build_model("paper-base", n_layers=2)
>>> model.num_parameters()
>>> aiayn.save(model, "out/model"); model = aiayn.load_model("out/model")
>>> bundle = aiayn.load("runs/multi30k")  # a checkpoint, a run or an HF folder
>>> bundle.model, bundle.tokenizer, bundle.run
>>> aiayn.scaled_dot_product_attention(q, k, v, mask, is_causal=True)
"""

from aiayn.checkpoint import Bundle, load, load_model, save
from aiayn.config import ModelConfig, get_preset, presets
from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM, TransformerModel, build_model
from aiayn.nn.attention import scaled_dot_product_attention
from aiayn.nn.cache import Cache, KVCache

__version__ = "0.1.0"

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
    "get_preset",
    "load",
    "load_model",
    "presets",
    "save",
    "scaled_dot_product_attention",
]
