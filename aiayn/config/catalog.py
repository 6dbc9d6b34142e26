"""The named presets: published model sizes, as ``ModelConfig``s (see the package's docstring)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiayn.config.model import ModelConfig
from aiayn.config.parts import AttentionConfig, FeedForwardConfig, PositionConfig
from aiayn.errors import ConfigError

# ----- presets ------------------------------------------------------------------------------


def _paper_base() -> ModelConfig:
    """Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (about 65M parameters)."""
    return ModelConfig()


def _paper_big() -> ModelConfig:
    """Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (about 213M)."""
    return ModelConfig(
        d_model=1024,
        dropout=0.3,
        attention=AttentionConfig(n_heads=16),
        ffn=FeedForwardConfig(d_ff=4096),
    )


def _gpt2_small() -> ModelConfig:
    return ModelConfig(
        arch="decoder",
        vocab_size=50257,
        n_layers=12,
        d_model=768,
        max_len=1024,
        norm_position="pre",
        scale_embeddings=False,
        pad_id=None,
        init="scaled-normal",
        attention=AttentionConfig(n_heads=12),
        positions=PositionConfig(scheme="learned"),
        ffn=FeedForwardConfig(d_ff=3072, activation="gelu_tanh"),
    )


def _llama_style_small() -> ModelConfig:
    return ModelConfig(
        arch="decoder",
        vocab_size=32000,
        n_layers=12,
        d_model=768,
        max_len=2048,
        norm="rmsnorm",
        norm_position="pre",
        norm_eps=1e-6,
        bias=False,
        dropout=0.0,
        scale_embeddings=False,
        tie_embeddings=False,
        pad_id=None,
        init="scaled-normal",
        attention=AttentionConfig(n_heads=12, n_kv_heads=4),
        positions=PositionConfig(scheme="rope"),
        ffn=FeedForwardConfig(d_ff=2048, activation="swiglu"),
    )


def _bert_base() -> ModelConfig:
    return ModelConfig(
        arch="encoder",
        vocab_size=30522,
        n_layers=12,
        d_model=768,
        max_len=512,
        norm_eps=1e-12,
        scale_embeddings=False,
        pad_id=0,
        init="scaled-normal",
        attention=AttentionConfig(n_heads=12),
        positions=PositionConfig(scheme="learned"),
        ffn=FeedForwardConfig(d_ff=3072, activation="gelu"),
    )


def _llama3_70b() -> ModelConfig:
    """Llama 3 70B (Meta's params.json / HF config): GQA 64/8 heads of 128, no biases, untied.

    Parameters: 80 x (attention 150,994,944 + SwiGLU 704,643,072 + 2 norms 16,384) + final
    norm 8,192 + embedding and output projection 2 x 1,050,673,152 = 70,553,706,496 -- the
    published count, exactly.  (Meta's rope_scaling for Llama 3.1 is not modelled.)
    """
    return ModelConfig(
        arch="decoder",
        vocab_size=128256,
        n_layers=80,
        d_model=8192,
        max_len=8192,
        norm="rmsnorm",
        norm_position="pre",
        norm_eps=1e-5,
        bias=False,
        dropout=0.0,
        scale_embeddings=False,
        tie_embeddings=False,
        pad_id=None,
        init="scaled-normal",
        attention=AttentionConfig(n_heads=64, n_kv_heads=8),
        positions=PositionConfig(scheme="rope", rope_base=500000.0),
        ffn=FeedForwardConfig(d_ff=28672, activation="swiglu"),
    )


_PRESETS: dict[str, Callable[[], ModelConfig]] = {
    "paper-base": _paper_base,
    "paper-big": _paper_big,
    "gpt2-small": _gpt2_small,
    "llama-style-small": _llama_style_small,
    "bert-base": _bert_base,
    "llama3-70b": _llama3_70b,
}


def presets() -> list[str]:
    """Names of the built-in model presets."""
    return list(_PRESETS)


def get_preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset's config, with ``overrides`` applied (settings in any spelling, as
    ``ModelConfig.replace`` takes them)."""
    if name not in _PRESETS:
        raise ConfigError(f"unknown preset {name!r}; expected one of {', '.join(presets())}")
    return _PRESETS[name]().replace(**overrides)
