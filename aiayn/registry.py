"""The names a model config may use for its pluggable parts, and where each one lives.

A config names its position scheme, norm, activation and attention backend by string; this
table maps each name to the object that implements it, as ``"module:attribute"``, imported
only when a model is built.  Adding one of these parts means writing its module and adding one
line here -- nothing else changes (ALiBi was added so: aiayn/nn/positions/alibi.py and the
line below).  ``register`` adds an entry at run time, from your own code, for experiments.

The table sits below everything else (next to aiayn/config/, which validates names against
it), so it names implementations without importing them.
"""

from __future__ import annotations

import importlib
from typing import Any

from aiayn.errors import ConfigError

REGISTRY: dict[str, dict[str, str | Any]] = {
    # PositionScheme subclasses (aiayn/nn/positions/): built from (PositionConfig, PositionSizes).
    "positional": {
        "sinusoidal": "aiayn.nn.positions.sinusoidal:SinusoidalPositions",
        "learned": "aiayn.nn.positions.learned:LearnedPositions",
        "rope": "aiayn.nn.positions.rope:RotaryPositions",
        "alibi": "aiayn.nn.positions.alibi:ALiBi",
        "none": "aiayn.nn.positions.base:PositionScheme",
    },
    # (d_model, eps, bias) -> nn.Module
    "norm": {
        "layernorm": "aiayn.nn.norms:layer_norm",
        "rmsnorm": "aiayn.nn.norms:rms_norm",
    },
    # (d_model, d_ff, bias) -> the position-wise feed-forward nn.Module (Eq. 2)
    "activation": {
        "relu": "aiayn.nn.feedforward:relu_ffn",
        "gelu": "aiayn.nn.feedforward:gelu_ffn",
        "gelu_tanh": "aiayn.nn.feedforward:gelu_tanh_ffn",
        "silu": "aiayn.nn.feedforward:silu_ffn",
        "swiglu": "aiayn.nn.feedforward:GatedFeedForward",
    },
    # functions with the aiayn.nn.attention.Backend signature
    "attention_backend": {
        "reference": "aiayn.nn.attention:reference_backend",
        "sdpa": "aiayn.nn.attention:sdpa_backend",
        "flash": "aiayn.nn.flash:flash_backend",
    },
}


def names(kind: str) -> tuple[str, ...]:
    """The registered names of one kind of part."""
    return tuple(REGISTRY[kind])


def resolve(kind: str, name: str) -> Any:
    """The implementation registered as ``name`` (imported on first use)."""
    table = REGISTRY[kind]
    if name not in table:
        raise ConfigError(f"unknown {kind} {name!r}; expected one of {', '.join(table)}")
    target = table[name]
    if isinstance(target, str):
        module, _, attribute = target.partition(":")
        target = getattr(importlib.import_module(module), attribute)
        table[name] = target
    return target


def register(kind: str, name: str, implementation: str | Any) -> None:
    """Add (or replace) a part under ``name``: an object, or its "module:attribute" path."""
    if kind not in REGISTRY:
        raise ConfigError(f"unknown kind of part {kind!r}; expected one of {', '.join(REGISTRY)}")
    REGISTRY[kind][name] = implementation
