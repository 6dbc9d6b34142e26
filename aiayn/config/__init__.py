"""Model configuration: frozen, validated dataclasses and the named presets.

A `ModelConfig` describes every architectural choice of the Transformer family that aiayn
builds.  Its core fields (the architecture, vocabulary, depth, width, norms, dropout, embeddings
and initialisation) sit on it directly; the choices of one concern sit in a sub-config of their
own: ``attention`` (``AttentionConfig``), ``positions`` (``PositionConfig``), ``ffn``
(``FeedForwardConfig``, with the mixture of experts), ``mixer`` (``MixerConfig``,
with the state-space layer), ``rnn`` (``RNNConfig``) and ``vision``
(``VisionConfig``).  Each is frozen (hashable, safe to share) and validates its own
fields in ``__post_init__``; the checks that span them (d_model against the heads, the mixer
against the architecture) are ModelConfig's.  A bad value raises ``ValueError`` naming the
class, the field, the value and what was expected.  Configs serialise to nested JSON so that a
checkpoint describes itself.

A setting has one spelling: a core field (``d_model``), or a sub-config's field, given as its
table (``attention={"n_heads": 8}`` in code, ``[model.attention]`` in TOML) or dotted
(``attention.n_heads``, as ``--set`` and sweeps name it); ``ModelConfig.from_dict``,
``ModelConfig.replace`` and ``get_preset`` read both forms.  The flat names every field had
before the sub-configs (``n_heads``, ``attention_dropout``; ``FLAT_NAMES`` maps each to its
place) are still read, with a ``DeprecatedSetting`` warning that names the spelling to write;
a checkpoint's stored config in the flat form loads silently (``ModelConfig.from_json``).

The presets reproduce published sizes:

* ``paper-base`` / ``paper-big`` -- Table 3 of Vaswani et al. (2017): the encoder-decoder with
  post-LN, ReLU, sinusoidal positions and a shared 37,000-token BPE vocabulary (§5.1, §3.4).
* ``gpt2-small`` -- Radford et al. (2019): decoder-only, pre-LN, learned positions, GELU.
* ``llama-style-small`` -- a small model with the Llama recipe (Touvron et al., 2023):
  RMSNorm, SwiGLU, rotary positions, grouped-query attention, no biases.
* ``bert-base`` -- Devlin et al. (2019): encoder-only, post-LN, learned positions, GELU, with
  a masked-language-model head.
* ``llama3-70b`` -- Llama 3 70B (Dubey et al., 2024): 80 layers, d_model 8192, 64 query heads
  sharing 8 key/value heads, SwiGLU d_ff 28672, a 128,256-token vocabulary, RoPE base 500,000,
  untied embeddings: 70,553,706,496 parameters.  Too big to instantiate here; it exists so that
  ``aiayn calc`` (aiayn/inspect/calc.py) can size a frontier-scale model.
"""

from __future__ import annotations

from aiayn.config.catalog import get_preset, presets
from aiayn.config.model import (
    DERIVED,
    FLAT_NAMES,
    ModelConfig,
    dotted_settings,
    field_names,
)
from aiayn.config.parts import (
    PARTS,
    Activation,
    Arch,
    AttentionConfig,
    BackendName,
    FeedForwardConfig,
    Init,
    Mixer,
    MixerConfig,
    Norm,
    NormPosition,
    Positional,
    PositionConfig,
    Quantization,
    RNNConfig,
    Score,
    VisionConfig,
)
from aiayn.config.validate import check_field_types, differing_fields

__all__ = [
    "DERIVED",
    "FLAT_NAMES",
    "PARTS",
    "Activation",
    "Arch",
    "AttentionConfig",
    "BackendName",
    "FeedForwardConfig",
    "Init",
    "Mixer",
    "MixerConfig",
    "ModelConfig",
    "Norm",
    "NormPosition",
    "PositionConfig",
    "Positional",
    "Quantization",
    "RNNConfig",
    "Score",
    "VisionConfig",
    "check_field_types",
    "differing_fields",
    "dotted_settings",
    "field_names",
    "get_preset",
    "presets",
]
