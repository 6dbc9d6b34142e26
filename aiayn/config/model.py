"""``ModelConfig``: the core fields of a model and its sub-configs, the checks that span them,
and the names its settings are read by (``dotted_settings``)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from aiayn import registry
from aiayn.config.parts import (
    PARTS,
    Arch,
    AttentionConfig,
    FeedForwardConfig,
    Init,
    MixerConfig,
    Norm,
    NormPosition,
    PositionConfig,
    Quantization,
    RNNConfig,
    VisionConfig,
)
from aiayn.config.validate import (
    _check_choices,
    _check_positive,
    _check_probability,
    _fail,
    check_field_types,
)
from aiayn.errors import ConfigError, DeprecatedSetting

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
        """The setting ``name`` (a field, or dotted: ``attention.n_heads``; a flat ``n_heads``
        warns, ``new_name``), or a derived size (``DERIVED``, e.g. ``head_dim``)."""
        if name in DERIVED:
            return getattr(self, name)
        dotted = new_name(name) if name in FLAT_NAMES else name
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
        """A config from settings as ``dotted_settings`` reads them (the nested form ``to_dict``
        writes, or dotted names); missing ones default."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a model config must be a table of settings, got {data!r}")
        return cls().replace(**dict(data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        """The config a checkpoint stores: the nested form, or the flat one that aiayn wrote
        before the sub-configs (read without a warning: the file is not the user's to fix)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"model config is not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise ConfigError(f"model config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(upgrade_flat_names(data))


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


_CORE = tuple(name for name in _fields(ModelConfig) if name not in PARTS)


def field_names() -> list[str]:
    """Every setting of a ModelConfig by its name: the core fields, then the sub-configs'
    fields, dotted (``attention.n_heads``)."""
    return [*_CORE, *(f"{part}.{name}" for part, cls in PARTS.items() for name in _fields(cls))]


def new_name(flat: str) -> str:
    """The dotted name of the flat setting ``flat`` (``n_heads`` -> ``attention.n_heads``),
    with a ``DeprecatedSetting`` warning that names it: one spelling is written, the old one
    is still read."""
    dotted = FLAT_NAMES[flat]
    part, _, inner = dotted.partition(".")
    warnings.warn(
        f"model setting {flat!r} is the flat spelling of older configs; write {dotted!r}"
        f" (in TOML: {inner} = ... under [model.{part}])",
        DeprecatedSetting,
        stacklevel=3,
    )
    return dotted


def upgrade_flat_names(data: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config with its flat names (``FLAT_NAMES``) replaced by their dotted ones,
    silently; a sub-config's table (``"mixer": {...}``) is kept as it is."""
    return {
        FLAT_NAMES[key] if key in FLAT_NAMES and not isinstance(value, Mapping) else key: value
        for key, value in data.items()
    }


def _spellings(key: str, value: Any) -> list[tuple[str, Any]]:
    """One setting as (dotted name, value) pairs (an unknown key comes back as it is, for
    ``dotted_settings`` to name)."""
    part_class = PARTS.get(key)
    if part_class is not None and isinstance(value, part_class):
        return [(f"{key}.{name}", getattr(value, name)) for name in _fields(part_class)]
    if part_class is not None and isinstance(value, Mapping):  # a [model.attention] table
        return [(f"{key}.{name}", v) for name, v in value.items()]
    if key in FLAT_NAMES:  # also "mixer" and "rnn" given a kind or a cell
        return [(new_name(key), value)]
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
    ``FLAT_NAMES``), read with a ``DeprecatedSetting`` warning naming the dotted one.  Raises ValueError naming unknown keys, or a setting given twice."""
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
            + f"; expected some of {field_names()}"
        )
    return found
