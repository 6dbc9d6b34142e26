"""The sub-configs of a model, one per concern: attention, positions, feed-forward (with the
mixture of experts), the sequence mixer (with the state-space layer), the RNN baseline and the
Vision Transformer's patches.  Each is frozen and checks its own fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from aiayn import registry
from aiayn.config.validate import (
    _check_choices,
    _check_positive,
    _check_probability,
    _fail,
    check_field_types,
)

Arch = Literal["encoder-decoder", "decoder", "encoder"]
NormPosition = Literal["post", "pre"]
Init = Literal["xavier", "scaled-normal"]
Score = Literal["dot", "additive"]
Mixer = Literal["attention", "linear", "ssm"]
Quantization = Literal["int8"]
# Pluggable parts are named by strings checked against aiayn/registry.py, so that a new one is
# one module and one registry line.
Positional = str
Norm = str
Activation = str
BackendName = str


# ----- the sub-configs ----------------------------------------------------------------------


@dataclass(frozen=True)
class AttentionConfig:
    """Multi-head attention (§3.2): ``n_heads`` heads (h) of ``d_head`` (d_k = d_v, default
    d_model // n_heads, §3.2.2), sharing ``n_kv_heads`` key/value heads."""

    n_heads: int = 8
    n_kv_heads: int | None = None  # None = n_heads (MHA); 1 = multi-query; else grouped-query
    d_head: int | None = None  # None = d_model // n_heads
    qkv_bias: bool | None = None  # biases on the Q, K, V projections; None = as ModelConfig.bias
    dropout: float = 0.0  # on the attention weights
    backend: BackendName = "sdpa"
    # Ablations of Table 3 and seed 003 (aiayn/experiment/ runs them): Bahdanau's additive
    # score w^T tanh(q + k) in place of the dot product (aiayn/nn/additive.py), and Eq. (1)
    # without its 1/sqrt(d_k).
    score: Score = "dot"
    scale: bool = True
    # Causal sliding window (Mistral): a query sees only the last `sliding_window` positions,
    # and the KV cache keeps only that many.  Decoder self-attention only; None = full causal.
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_choices(self, {"score": get_args(Score)})
        _check_choices(self, {"backend": registry.names("attention_backend")})
        _check_positive(self, ("n_heads",))
        _check_positive(self, ("n_kv_heads", "d_head", "sliding_window"), optional=True)
        if self.n_heads % self.kv_heads:
            raise _fail(self, "n_heads", self.n_heads, f"a multiple of n_kv_heads={self.kv_heads}")
        _check_probability(self, "dropout")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


@dataclass(frozen=True)
class PositionConfig:
    """How positions enter the model: the ``scheme`` aiayn/registry.py names (sinusoidal,
    §3.5; learned; rotary; ALiBi; none), and the rotary base and position interpolation."""

    scheme: Positional = "sinusoidal"
    rope_base: float = 10000.0
    rope_scaling: float = 1.0  # positions are divided by this (linear position interpolation)

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_choices(self, {"scheme": registry.names("positional")})
        for name in ("rope_base", "rope_scaling"):
            if getattr(self, name) <= 0:
                raise _fail(self, name, getattr(self, name), "> 0")


@dataclass(frozen=True)
class FeedForwardConfig:
    """The position-wise feed-forward sublayer (Eq. 2): width ``d_ff`` and its activation; or,
    ``n_experts`` set, a mixture of experts of size d_ff in its place (aiayn/nn/moe.py), each
    token routed to the ``top_k`` best, an expert holding at most ``capacity_factor`` times
    its fair share (None = never drop)."""

    d_ff: int = 2048
    activation: Activation = "relu"
    n_experts: int | None = None  # None = dense
    top_k: int = 2
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_choices(self, {"activation": registry.names("activation")})
        _check_positive(self, ("d_ff",))
        _check_positive(self, ("n_experts",), optional=True)
        if self.n_experts is not None and not 1 <= self.top_k <= self.n_experts:
            raise _fail(self, "top_k", self.top_k, f"between 1 and n_experts={self.n_experts}")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise _fail(self, "capacity_factor", self.capacity_factor, "> 0 or None")


@dataclass(frozen=True)
class MixerConfig:
    """What mixes positions in a decoder-only model's layers: softmax "attention" (Eq. 1),
    "linear" attention (aiayn/nn/linear_attention.py: O(n) training, an O(1) decoding state),
    or "ssm", a selective state-space layer (Mamba-2, aiayn/nn/ssm.py).  ``attention_every``
    = k makes a hybrid: the last layer of every k keeps softmax attention (Jamba's pattern:
    one attention layer among recurrent ones).

    The "ssm" layer has state size N = ``ssm_state``, inner width ``ssm_expand`` · d_model in
    heads of ``ssm_head_dim`` channels (one decay per head), and a causal depthwise
    convolution of ``ssm_conv`` taps."""

    kind: Mixer = "attention"
    attention_every: int | None = None
    ssm_state: int = 16
    ssm_expand: int = 2
    ssm_conv: int = 4
    ssm_head_dim: int = 64

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_choices(self, {"kind": get_args(Mixer)})
        _check_positive(self, ("ssm_state", "ssm_expand", "ssm_conv", "ssm_head_dim"))
        if self.attention_every is not None:
            if self.kind == "attention":
                raise _fail(
                    self, "attention_every", self.attention_every, "None with kind='attention'"
                )
            _check_positive(self, ("attention_every",), optional=True)

    def at(self, layer: int) -> str:
        """The mixer of layer ``layer`` (from 0): ``kind``, except the softmax-attention
        layers of a hybrid (``attention_every``)."""
        if self.attention_every is not None and (layer + 1) % self.attention_every == 0:
            return "attention"
        return self.kind


@dataclass(frozen=True)
class RNNConfig:
    """The recurrent baselines of aiayn/models/rnn.py in place of the Transformer (an
    encoder-decoder only): ``cell`` "gru" or "lstm" layers (n_layers each side, d_model wide),
    with Bahdanau's additive ``attention`` or, False, the last encoder state only.  An RNN
    reads vocab_size, src_vocab_size, n_layers, n_decoder_layers, d_model, dropout,
    tie_embeddings, pad_id, max_len, init and init_std; the Transformer's other settings
    (attention, positions, ffn, norms) do not apply to it."""

    cell: Literal["gru", "lstm"] | None = None  # None = the Transformer
    attention: bool = True

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.cell not in (None, "gru", "lstm"):
            raise _fail(self, "cell", self.cell, "'gru', 'lstm' or None (the Transformer)")


@dataclass(frozen=True)
class VisionConfig:
    """Images (the Vision Transformer, aiayn/models/vision.py; an encoder): square images of
    ``image_size`` pixels (None = a text model) and ``channels`` channels, cut into
    ``patch_size`` patches, classified into ``n_classes`` by the [CLS] token ("cls") or the
    mean of the patches ("mean")."""

    image_size: int | None = None
    patch_size: int = 16
    channels: int = 3
    n_classes: int | None = None
    pool: Literal["cls", "mean"] = "cls"

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_choices(self, {"pool": ("cls", "mean")})
        _check_positive(self, ("patch_size", "channels"))
        if self.image_size is None:
            return
        if self.image_size % self.patch_size:
            raise _fail(
                self, "image_size", self.image_size, f"a multiple of patch_size={self.patch_size}"
            )
        if self.n_classes is None or self.n_classes < 2:
            raise _fail(self, "n_classes", self.n_classes, "at least 2 classes for an image model")


# The sub-configs, by the ModelConfig field that holds each.
PARTS: dict[str, type] = {
    "attention": AttentionConfig,
    "positions": PositionConfig,
    "ffn": FeedForwardConfig,
    "mixer": MixerConfig,
    "rnn": RNNConfig,
    "vision": VisionConfig,
}
# The flat names of the settings that moved into a sub-config -> their dotted names.  Old
# checkpoints (config.json), TOML files, --set overrides and sweeps use them; they are read,
# and the nested form is written.
