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

Settings are named three ways, all read by ``ModelConfig.from_dict``,
``ModelConfig.replace`` and ``get_preset``: a core field (``d_model``), a dotted
sub-config field (``attention.n_heads``, or a ``[model.attention]`` TOML table), and the flat
name every field had before the sub-configs (``n_heads``, ``attention_dropout``), which old
checkpoints, TOML files and sweeps still use (``FLAT_NAMES`` maps each to its new place).

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

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from aiayn import registry
from aiayn.errors import ConfigError

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


def _fail(owner: object, name: str, value: object, expected: str) -> ConfigError:
    return ConfigError(f"{type(owner).__name__}.{name}={value!r} is invalid: expected {expected}")


def check_field_types(config: Any) -> None:
    """Each field of the dataclass ``config`` holds a value of its annotated type (bool, int,
    float, str, None and unions of them; other annotations are left to the class's own
    checks).  A TOML file or a ``--set`` override can give any type: ``bias = "False"`` (a
    string, which is truthy) or ``lr = "fast"``.  Raises ValueError naming the field, the
    value and what was expected."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        ok, expected = _type_matches(value, hints.get(f.name))
        if not ok:
            raise _fail(config, f.name, value, expected)


def _check_choices(config: Any, choices: Mapping[str, Iterable[str]]) -> None:
    """Each named field holds one of its choices (a Literal's values, or a registry's names)."""
    for name, allowed in choices.items():
        value, allowed = getattr(config, name), tuple(allowed)
        if value not in allowed:
            raise _fail(config, name, value, f"one of {', '.join(map(repr, allowed))}")


def _check_positive(config: Any, names: Iterable[str], *, optional: bool = False) -> None:
    """Each named integer field is >= 1 (or None, when ``optional``); check_field_types has
    seen to the type."""
    for name in names:
        value = getattr(config, name)
        if optional and value is None:
            continue
        if value < 1:
            raise _fail(config, name, value, "a positive integer" + " or None" * optional)


def _check_probability(config: Any, name: str) -> None:
    value = getattr(config, name)
    if not 0.0 <= value < 1.0:
        raise _fail(config, name, value, "a probability in [0, 1)")


def differing_fields(a: Any, b: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The fields (outside ``skip``) in which two dataclasses of one type differ; a field that
    holds a dataclass (a ModelConfig's sub-configs) is compared field by field, and named
    dotted (``attention.n_heads``).  ``skip`` names fields the same way."""
    found = []
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name in skip or x == y:
            continue
        if dataclasses.is_dataclass(x) and type(x) is type(y):
            inner = tuple(s.removeprefix(f"{f.name}.") for s in skip if s.startswith(f"{f.name}."))
            found += [f"{f.name}.{name}" for name in differing_fields(x, y, inner)]
        else:
            found.append(f.name)
    return found


def _type_matches(value: object, hint: Any) -> tuple[bool, str]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        results = [_type_matches(value, part) for part in typing.get_args(hint)]
        return any(ok for ok, _ in results), " or ".join(e for _, e in results if e)
    if hint is type(None):
        return value is None, "None"
    if hint is bool:
        return isinstance(value, bool), "true or false"
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), "an integer"
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool), "a number"
    if hint is str:
        return isinstance(value, str), "a string"
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        return value in choices, f"one of {', '.join(map(repr, choices))}"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):  # a ModelConfig sub-config
        return isinstance(value, hint), f"a sub-config ({hint.__name__})"
    return True, ""


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
FLAT_NAMES: dict[str, str] = {
    "n_heads": "attention.n_heads",
    "n_kv_heads": "attention.n_kv_heads",
    "d_head": "attention.d_head",
    "qkv_bias": "attention.qkv_bias",
    "attention_dropout": "attention.dropout",
    "attention_backend": "attention.backend",
    "attention_score": "attention.score",
    "attention_scale": "attention.scale",
    "sliding_window": "attention.sliding_window",
    "positional": "positions.scheme",
    "rope_base": "positions.rope_base",
    "rope_scaling": "positions.rope_scaling",
    "d_ff": "ffn.d_ff",
    "activation": "ffn.activation",
    "n_experts": "ffn.n_experts",
    "experts_top_k": "ffn.top_k",
    "expert_capacity_factor": "ffn.capacity_factor",
    "mixer": "mixer.kind",
    "attention_every": "mixer.attention_every",
    "ssm_state": "mixer.ssm_state",
    "ssm_expand": "mixer.ssm_expand",
    "ssm_conv": "mixer.ssm_conv",
    "ssm_head_dim": "mixer.ssm_head_dim",
    "rnn": "rnn.cell",
    "rnn_attention": "rnn.attention",
    "image_size": "vision.image_size",
    "patch_size": "vision.patch_size",
    "channels": "vision.channels",
    "n_classes": "vision.n_classes",
    "pool": "vision.pool",
}
# Sizes derived from the fields, readable by name like them (ModelConfig.value).
DERIVED = ("projection_bias", "kv_heads", "head_dim", "decoder_layers", "source_vocab_size")


# ----- the model ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """Every architectural choice of a Transformer model: the core fields here, each concern's
    in its sub-config (the module docstring lists them).

    Field names follow the paper where it has one: ``d_model``, ``n_layers`` (N),
    ``attention.n_heads`` (h), ``attention.d_head`` (d_k = d_v), ``ffn.d_ff``.
    """

    arch: Arch = "encoder-decoder"
    vocab_size: int = 37000
    # Source vocabulary of an encoder-decoder; None = shared with the target (paper §5.1).
    src_vocab_size: int | None = None
    n_layers: int = 6  # encoder layers, or all layers of a single-stack model
    n_decoder_layers: int | None = None  # decoder layers of an encoder-decoder; None = n_layers
    d_model: int = 512
    max_len: int = 1024
    norm: Norm = "layernorm"
    norm_position: NormPosition = "post"
    norm_eps: float = 1e-5
    bias: bool = True
    dropout: float = 0.1
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model), §3.4
    tie_embeddings: bool = True  # share input embeddings and the output projection, §3.4
    # Ablation of seed 003: every sublayer without its residual connection (§3.1's
    # "x + Sublayer(x)" becomes "Sublayer(x)").
    residual: bool = True
    pad_id: int | None = 0
    # BERT's extras (Devlin et al., 2019): segment embeddings for type_vocab_size token types
    # added to the input (0 = none), a norm over the summed embeddings, the [CLS] pooler
    # (dense + tanh over position 0, encoders), and whether an encoder has its masked-LM head
    # (a BertModel, e.g. for sentence embeddings, has none).
    type_vocab_size: int = 0
    embedding_norm: bool = False
    # A bias on the output projection to the vocabulary (Marian's final_logits_bias).
    head_bias: bool = False
    pooler: bool = False
    mlm_head: bool = True
    # Initial weights.  "xavier": Glorot-uniform matrices, the lineage of the paper's code
    # (tensor2tensor, the Annotated Transformer); with post-LN it lets the decoder use the
    # source from the first hundred steps (README, "The demo").  "scaled-normal": N(0,
    # init_std) with the residual output projections shrunk by 1/sqrt(2N), GPT-2's choice
    # for pre-LN stacks, whose residual stream adds up every layer's output.
    init: Init = "xavier"
    init_std: float = 0.02
    # How the linear layers' weights are stored: None (the model's float dtype), or "int8"
    # (one scale per output channel, aiayn/nn/quantized.py): a checkpoint written by `aiayn
    # convert --quantize int8`, which decodes without being quantized again and never trains.
    quantization: Quantization | None = None
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    positions: PositionConfig = field(default_factory=PositionConfig)
    ffn: FeedForwardConfig = field(default_factory=FeedForwardConfig)
    mixer: MixerConfig = field(default_factory=MixerConfig)
    rnn: RNNConfig = field(default_factory=RNNConfig)
    vision: VisionConfig = field(default_factory=VisionConfig)

    def __post_init__(self) -> None:
        check_field_types(self)  # the sub-configs have checked their own fields
        _check_choices(self, {"arch": get_args(Arch), "norm_position": get_args(NormPosition)})
        _check_choices(self, {"init": get_args(Init), "norm": registry.names("norm")})
        if self.quantization is not None and self.quantization not in get_args(Quantization):
            raise _fail(self, "quantization", self.quantization, "None or 'int8'")
        _check_positive(self, ("vocab_size", "n_layers", "d_model", "max_len"))
        _check_positive(self, ("src_vocab_size", "n_decoder_layers"), optional=True)
        _check_probability(self, "dropout")
        if self.norm_eps <= 0:
            raise _fail(self, "norm_eps", self.norm_eps, "> 0")
        self._check_heads()
        self._check_mixer()
        self._check_images()
        self._check_rnn()
        self._check_vocabulary()
        self._check_extras()

    def _check_heads(self) -> None:
        a = self.attention
        if a.d_head is None and self.d_model % a.n_heads:
            raise _fail(
                self,
                "d_model",
                self.d_model,
                f"a multiple of attention.n_heads={a.n_heads} (or set attention.d_head)",
            )
        if self.positions.scheme == "rope" and self.head_dim % 2:
            raise _fail(
                self, "attention.d_head", self.head_dim, "an even head size for rotary positions"
            )
        if a.sliding_window is not None and self.arch == "encoder":
            raise _fail(
                self,
                "attention.sliding_window",
                a.sliding_window,
                "None for arch='encoder' (it is causal)",
            )

    def _check_mixer(self) -> None:
        """A recurrent mixer: decoder-only, without the options of softmax scores."""
        kind = self.mixer.kind
        if kind == "attention":
            return
        if self.arch != "decoder":
            raise _fail(
                self, "mixer.kind", kind, f"'attention' for arch={self.arch!r} (decoder only)"
            )
        for name, ok in (("sliding_window", None), ("score", "dot")):
            if getattr(self.attention, name) != ok:
                value = getattr(self.attention, name)
                raise _fail(self, f"attention.{name}", value, f"{ok!r} with mixer.kind={kind!r}")
        if self.positions.scheme == "alibi":
            raise _fail(
                self, "positions.scheme", "alibi", f"not ALiBi with mixer.kind={kind!r} (no scores)"
            )
        inner = self.mixer.ssm_expand * self.d_model
        if kind == "ssm" and inner % self.mixer.ssm_head_dim:
            raise _fail(
                self,
                "mixer.ssm_head_dim",
                self.mixer.ssm_head_dim,
                f"a divisor of the inner width mixer.ssm_expand * d_model = {inner}",
            )

    def _check_images(self) -> None:
        v = self.vision
        if v.image_size is None:
            return
        if self.arch != "encoder":
            raise _fail(
                self,
                "vision.image_size",
                v.image_size,
                f"None for arch={self.arch!r} (images: an encoder)",
            )
        if self.positions.scheme not in ("learned", "sinusoidal", "none"):
            raise _fail(
                self,
                "positions.scheme",
                self.positions.scheme,
                "'learned', 'sinusoidal' or 'none' for images",
            )

    def _check_rnn(self) -> None:
        cell = self.rnn.cell
        if cell is not None and self.arch != "encoder-decoder":
            raise _fail(
                self, "rnn.cell", cell, f"None for arch={self.arch!r} (RNN baselines translate)"
            )
        if cell is not None and self.d_model % 2:
            raise _fail(
                self, "d_model", self.d_model, "an even width for a bidirectional RNN encoder"
            )

    def _check_vocabulary(self) -> None:
        if self.arch != "encoder-decoder":
            for name in ("src_vocab_size", "n_decoder_layers"):
                if getattr(self, name) is not None:
                    raise _fail(self, name, getattr(self, name), f"None for arch={self.arch!r}")
        if (
            self.tie_embeddings
            and self.src_vocab_size is not None
            and self.src_vocab_size != self.vocab_size
        ):
            raise _fail(
                self,
                "tie_embeddings",
                True,
                f"False when src_vocab_size={self.src_vocab_size} != vocab_size={self.vocab_size}"
                " (tying needs a shared vocabulary)",
            )
        if self.pad_id is not None and not 0 <= self.pad_id < min(
            self.vocab_size, self.source_vocab_size
        ):
            raise _fail(self, "pad_id", self.pad_id, "an id inside the vocabulary, or None")

    def _check_extras(self) -> None:
        """BERT's and Marian's extras belong to the architectures that have them."""
        if self.type_vocab_size < 0:
            raise _fail(self, "type_vocab_size", self.type_vocab_size, "an integer >= 0")
        if self.arch == "encoder" and self.head_bias:
            raise _fail(
                self, "head_bias", True, "False for arch='encoder' (its masked-LM head has one)"
            )
        if self.arch != "encoder":
            for name, off in (("type_vocab_size", 0), ("pooler", False), ("mlm_head", True)):
                if getattr(self, name) != off:
                    raise _fail(self, name, getattr(self, name), f"{off!r} for arch={self.arch!r}")

    # ----- derived sizes -------------------------------------------------------------------
    @property
    def projection_bias(self) -> bool:
        """Whether the Q, K, V projections have biases."""
        return self.bias if self.attention.qkv_bias is None else self.attention.qkv_bias

    @property
    def kv_heads(self) -> int:
        return self.attention.kv_heads

    @property
    def head_dim(self) -> int:
        a = self.attention
        return self.d_model // a.n_heads if a.d_head is None else a.d_head

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    def mixer_at(self, layer: int) -> str:
        """The mixer of layer ``layer`` (from 0); see ``MixerConfig.at``."""
        return self.mixer.at(layer)

    @property
    def source_vocab_size(self) -> int:
        return self.vocab_size if self.src_vocab_size is None else self.src_vocab_size

    def value(self, name: str) -> Any:
        """The setting ``name`` in any of its spellings (a field, ``attention.n_heads`` or
        the flat ``n_heads``), or a derived size (``DERIVED``, e.g. ``head_dim``)."""
        if name in DERIVED:
            return getattr(self, name)
        dotted = FLAT_NAMES.get(name, name)
        if dotted not in PARTS and dotted not in field_names():
            raise ConfigError(
                f"unknown ModelConfig field {name!r}; expected one of {field_names()}"
            )
        part, _, inner = dotted.partition(".")
        value = getattr(self, part)
        return getattr(value, inner) if inner else value

    # ----- serialisation -------------------------------------------------------------------
    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with some settings changed (validated again), named in any spelling (see
        ``dotted_settings``); a sub-config given as a table changes only the fields it
        names.  Unknown names raise."""
        changes: dict[str, Any] = {}
        parts: dict[str, dict[str, Any]] = {}
        for dotted, value in dotted_settings(overrides).items():
            part, _, inner = dotted.partition(".")
            if inner:
                parts.setdefault(part, {})[inner] = value
            else:
                changes[part] = value
        for part, fields in parts.items():
            changes[part] = dataclasses.replace(getattr(self, part), **fields)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The nested form: the core fields, and a table for each sub-config."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """A config from settings in any spelling (``dotted_settings``): the nested form
        ``to_dict`` writes, or the flat one of older checkpoints; missing ones default."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a model config must be a table of settings, got {data!r}")
        return cls().replace(**dict(data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"model config is not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise ConfigError(f"model config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


_CORE = tuple(name for name in _fields(ModelConfig) if name not in PARTS)


def field_names() -> list[str]:
    """Every setting of a ModelConfig by its name: the core fields, then the sub-configs'
    fields, dotted (``attention.n_heads``)."""
    return [*_CORE, *(f"{part}.{name}" for part, cls in PARTS.items() for name in _fields(cls))]


def _spellings(key: str, value: Any) -> list[tuple[str, Any]]:
    """One setting as (dotted name, value) pairs (an unknown key comes back as it is, for
    ``dotted_settings`` to name)."""
    part_class = PARTS.get(key)
    if part_class is not None and isinstance(value, part_class):
        return [(f"{key}.{name}", getattr(value, name)) for name in _fields(part_class)]
    if part_class is not None and isinstance(value, Mapping):  # a [model.attention] table
        return [(f"{key}.{name}", v) for name, v in value.items()]
    if key in FLAT_NAMES:  # also "mixer" and "rnn" given a kind or a cell
        return [(FLAT_NAMES[key], value)]
    if part_class is not None:
        raise ConfigError(
            f"ModelConfig.{key}={value!r} is invalid: expected a sub-config"
            f" ({part_class.__name__}) or a table of its fields"
        )
    return [(key, value)]


def dotted_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Model settings in any spelling -> by their dotted names, as ``field_names`` lists
    them.  A key may be a core field (``d_model``), a dotted sub-config field
    (``attention.n_heads``), a sub-config (``attention``) holding an ``AttentionConfig``
    or a table of its fields, or a flat name of older configs (``n_heads``,
    ``FLAT_NAMES``).  Raises ValueError naming unknown keys, or a setting given twice."""
    known = set(field_names())
    found: dict[str, Any] = {}
    given: dict[str, str] = {}  # dotted name -> the key that gave it
    unknown = []
    for key, value in settings.items():
        for dotted, v in _spellings(key, value):
            if dotted not in known:
                unknown.append(dotted)
            elif dotted in given:
                raise ConfigError(
                    f"ModelConfig setting {dotted} is given twice (as {given[dotted]!r} and as"
                    f" {key!r}); give it once"
                )
            given[dotted], found[dotted] = key, v
    if unknown:
        near = [f"{p}.{u}" for u in sorted(unknown) for p, c in PARTS.items() if u in _fields(c)]
        raise ConfigError(
            f"unknown ModelConfig field(s) {sorted(unknown)}"
            + (f" (did you mean {', '.join(near)}?)" if near else "")
            + f"; expected some of {field_names()} (or their flat names of older configs, such"
            " as n_heads)"
        )
    return found


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
