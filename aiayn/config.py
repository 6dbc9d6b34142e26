"""Model configuration: one frozen, validated dataclass and the named presets.

A `ModelConfig` describes every architectural choice of the Transformer family that aiayn
builds.  It is frozen (hashable, safe to share), validated in ``__post_init__`` (a bad value
raises ``ValueError`` naming the field, the value and what was expected), and serialisable to
JSON so that a checkpoint describes itself.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from aiayn import registry

Arch = Literal["encoder-decoder", "decoder", "encoder"]
NormPosition = Literal["post", "pre"]
Init = Literal["xavier", "scaled-normal"]
Score = Literal["dot", "additive"]
Mixer = Literal["attention", "linear", "ssm"]
# Pluggable parts are named by strings checked against aiayn/registry.py, so that a new one is
# one module and one registry line.
Positional = str
Norm = str
Activation = str
BackendName = str

_CHOICES: dict[str, tuple[str, ...]] = {
    "arch": get_args(Arch),
    "norm_position": get_args(NormPosition),
    "init": get_args(Init),
    "attention_score": get_args(Score),
    "mixer": get_args(Mixer),
}
_REGISTERED = {  # field -> kind in aiayn.registry
    "positional": "positional",
    "norm": "norm",
    "activation": "activation",
    "attention_backend": "attention_backend",
}


def _fail(name: str, value: object, expected: str) -> ValueError:
    return ValueError(f"ModelConfig.{name}={value!r} is invalid: expected {expected}")


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
            raise ValueError(
                f"{type(config).__name__}.{f.name}={value!r} is invalid: expected {expected}"
            )


def differing_fields(a: Any, b: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The fields (outside ``skip``) in which two dataclasses of one type differ."""
    return [
        f.name
        for f in dataclasses.fields(a)
        if f.name not in skip and getattr(a, f.name) != getattr(b, f.name)
    ]


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
    if typing.get_origin(hint) is typing.Literal:  # the class's own check names the choices
        return isinstance(value, str | int | bool | type(None)), "one of the choices"
    return True, ""


@dataclass(frozen=True)
class ModelConfig:
    """Every architectural choice of a Transformer model.

    Field names follow the paper where it has one: ``d_model``, ``n_heads`` (h), ``d_ff``,
    ``n_layers`` (N).  ``d_head`` (d_k = d_v) defaults to ``d_model // n_heads`` (§3.2.2).
    """

    arch: Arch = "encoder-decoder"
    vocab_size: int = 37000
    # Source vocabulary of an encoder-decoder; None = shared with the target (paper §5.1).
    src_vocab_size: int | None = None
    n_layers: int = 6  # encoder layers, or all layers of a single-stack model
    n_decoder_layers: int | None = None  # decoder layers of an encoder-decoder; None = n_layers
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None  # None = n_heads (MHA); 1 = multi-query; else grouped-query
    d_head: int | None = None  # None = d_model // n_heads
    d_ff: int = 2048
    max_len: int = 1024
    positional: Positional = "sinusoidal"
    rope_base: float = 10000.0
    rope_scaling: float = 1.0  # positions are divided by this (linear position interpolation)
    norm: Norm = "layernorm"
    norm_position: NormPosition = "post"
    norm_eps: float = 1e-5
    activation: Activation = "relu"
    bias: bool = True
    qkv_bias: bool | None = (
        None  # biases on the Q, K, V projections; None = as `bias` (Qwen2: True)
    )
    dropout: float = 0.1
    attention_dropout: float = 0.0
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model), §3.4
    tie_embeddings: bool = True  # share input embeddings and the output projection, §3.4
    attention_backend: BackendName = "sdpa"
    # Ablations of Table 3 and seed 003 (aiayn/experiment/ runs them): Bahdanau's additive
    # score w^T tanh(q + k) in place of the dot product (aiayn/nn/additive.py); Eq. (1)
    # without its 1/sqrt(d_k); every sublayer without its residual connection (§3.1's
    # "x + Sublayer(x)" becomes "Sublayer(x)").
    attention_score: Score = "dot"
    attention_scale: bool = True
    residual: bool = True
    # The recurrent baselines of aiayn/models/rnn.py in place of the Transformer (an
    # encoder-decoder only): "gru" or "lstm" layers (n_layers each side, d_model wide), with
    # Bahdanau's additive attention or, rnn_attention = False, the last encoder state only.
    # An RNN reads vocab_size, src_vocab_size, n_layers, n_decoder_layers, d_model, dropout,
    # tie_embeddings, pad_id, max_len, init and init_std; the Transformer's other fields
    # (heads, d_ff, positions, norms, attention options, experts) do not apply to it.
    rnn: Literal["gru", "lstm"] | None = None
    rnn_attention: bool = True
    # What mixes positions in a decoder-only model's layers: softmax "attention" (Eq. 1),
    # "linear" attention (aiayn/nn/linear_attention.py: O(n) training, an O(1) decoding
    # state), or "ssm", a selective state-space layer (Mamba-2, aiayn/nn/ssm.py).
    # attention_every = k makes a hybrid: the last layer of every k keeps softmax attention
    # (Jamba's pattern: one attention layer among recurrent ones).
    mixer: Mixer = "attention"
    attention_every: int | None = None
    # "ssm": Mamba-2's selective state-space layer (aiayn/nn/ssm.py): state size N, inner width
    # ssm_expand · d_model in heads of ssm_head_dim channels (one decay per head), causal
    # depthwise convolution of ssm_conv taps.
    ssm_state: int = 16
    ssm_expand: int = 2
    ssm_conv: int = 4
    ssm_head_dim: int = 64
    # Images (the Vision Transformer, aiayn/models/vision.py; an encoder): square images of
    # image_size pixels and `channels` channels, cut into patch_size patches, classified into
    # n_classes by the [CLS] token ("cls") or the mean of the patches ("mean").
    image_size: int | None = None
    patch_size: int = 16
    channels: int = 3
    n_classes: int | None = None
    pool: Literal["cls", "mean"] = "cls"
    # Causal sliding window (Mistral): a query sees only the last `sliding_window` positions,
    # and the KV cache keeps only that many.  Decoder self-attention only; None = full causal.
    sliding_window: int | None = None
    # Mixture of experts in place of every feed-forward sublayer (aiayn/nn/moe.py): None =
    # dense; else E experts of size d_ff, each token routed to the top `experts_top_k`.
    n_experts: int | None = None
    experts_top_k: int = 2
    expert_capacity_factor: float | None = None  # None = never drop; see aiayn/nn/moe.py
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

    def __post_init__(self) -> None:
        check_field_types(self)
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise _fail(name, value, f"one of {', '.join(map(repr, choices))}")
        for name, kind in _REGISTERED.items():
            value = getattr(self, name)
            if value not in registry.names(kind):
                raise _fail(name, value, f"one of {', '.join(map(repr, registry.names(kind)))}")
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "d_ff", "max_len",
                     "ssm_state", "ssm_expand", "ssm_conv", "ssm_head_dim", "patch_size",
                     "channels"):  # fmt: skip
            value = getattr(self, name)
            if value < 1:  # an int: check_field_types has seen to the type
                raise _fail(name, value, "a positive integer")
        optional = ("src_vocab_size", "n_decoder_layers", "n_kv_heads", "d_head")
        for name in (*optional, "sliding_window", "n_experts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise _fail(name, value, "a positive integer or None")
        if self.d_head is None and self.d_model % self.n_heads:
            raise _fail(
                "d_model", self.d_model, f"a multiple of n_heads={self.n_heads} (or set d_head)"
            )
        if self.n_heads % self.kv_heads:
            raise _fail("n_heads", self.n_heads, f"a multiple of n_kv_heads={self.kv_heads}")
        if self.positional == "rope" and self.head_dim % 2:
            raise _fail("d_head", self.head_dim, "an even head size for rotary positions")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise _fail(name, value, "a probability in [0, 1)")
        if self.mixer != "attention":
            if self.arch != "decoder":
                raise _fail(
                    "mixer", self.mixer, f"'attention' for arch={self.arch!r} (decoder only)"
                )
            for name, ok in (("sliding_window", None), ("attention_score", "dot")):
                if getattr(self, name) != ok:
                    raise _fail(name, getattr(self, name), f"{ok!r} with mixer={self.mixer!r}")
            if self.positional == "alibi":
                raise _fail(
                    "positional", "alibi", f"not ALiBi with mixer={self.mixer!r} (no scores)"
                )
            inner = self.ssm_expand * self.d_model
            if self.mixer == "ssm" and inner % self.ssm_head_dim:
                raise _fail(
                    "ssm_head_dim",
                    self.ssm_head_dim,
                    f"a divisor of the inner width ssm_expand * d_model = {inner}",
                )
        if self.attention_every is not None:
            if self.mixer == "attention":
                raise _fail("attention_every", self.attention_every, "None with mixer='attention'")
            if self.attention_every < 1:
                raise _fail("attention_every", self.attention_every, "a positive integer or None")
        if self.image_size is not None:
            if self.arch != "encoder":
                raise _fail(
                    "image_size",
                    self.image_size,
                    f"None for arch={self.arch!r} (images: an encoder)",
                )
            if (
                isinstance(self.image_size, bool)
                or not isinstance(self.image_size, int)
                or self.image_size % self.patch_size
            ):
                raise _fail(
                    "image_size", self.image_size, f"a multiple of patch_size={self.patch_size}"
                )
            if self.n_classes is None or self.n_classes < 2:
                raise _fail("n_classes", self.n_classes, "at least 2 classes for an image model")
            if self.pool not in ("cls", "mean"):
                raise _fail("pool", self.pool, "'cls' or 'mean'")
            if self.positional not in ("learned", "sinusoidal", "none"):
                raise _fail(
                    "positional", self.positional, "'learned', 'sinusoidal' or 'none' for images"
                )
        if self.rnn not in (None, "gru", "lstm"):
            raise _fail("rnn", self.rnn, "'gru', 'lstm' or None (the Transformer)")
        if self.rnn is not None and self.arch != "encoder-decoder":
            raise _fail("rnn", self.rnn, f"None for arch={self.arch!r} (RNN baselines translate)")
        if self.rnn is not None and self.d_model % 2:
            raise _fail("d_model", self.d_model, "an even width for a bidirectional RNN encoder")
        if self.sliding_window is not None and self.arch == "encoder":
            raise _fail(
                "sliding_window", self.sliding_window, "None for arch='encoder' (it is causal)"
            )
        if self.n_experts is not None and not 1 <= self.experts_top_k <= self.n_experts:
            raise _fail(
                "experts_top_k", self.experts_top_k, f"between 1 and n_experts={self.n_experts}"
            )
        if self.expert_capacity_factor is not None and self.expert_capacity_factor <= 0:
            raise _fail("expert_capacity_factor", self.expert_capacity_factor, "> 0 or None")
        if self.rope_base <= 0 or self.rope_scaling <= 0:
            raise _fail("rope_base/rope_scaling", (self.rope_base, self.rope_scaling), "> 0")
        if self.norm_eps <= 0:
            raise _fail("norm_eps", self.norm_eps, "> 0")
        if self.arch != "encoder-decoder":
            if self.src_vocab_size is not None:
                raise _fail("src_vocab_size", self.src_vocab_size, f"None for arch={self.arch!r}")
            if self.n_decoder_layers is not None:
                raise _fail(
                    "n_decoder_layers", self.n_decoder_layers, f"None for arch={self.arch!r}"
                )
        if (
            self.tie_embeddings
            and self.src_vocab_size is not None
            and self.src_vocab_size != self.vocab_size
        ):
            raise _fail(
                "tie_embeddings",
                True,
                f"False when src_vocab_size={self.src_vocab_size} != vocab_size={self.vocab_size}"
                " (tying needs a shared vocabulary)",
            )
        if self.pad_id is not None and not 0 <= self.pad_id < min(
            self.vocab_size, self.source_vocab_size
        ):
            raise _fail("pad_id", self.pad_id, "an id inside the vocabulary, or None")
        if isinstance(self.type_vocab_size, bool) or not (
            isinstance(self.type_vocab_size, int) and self.type_vocab_size >= 0
        ):
            raise _fail("type_vocab_size", self.type_vocab_size, "an integer >= 0")
        if self.arch == "encoder" and self.head_bias:
            raise _fail("head_bias", True, "False for arch='encoder' (its masked-LM head has one)")
        if self.arch != "encoder":
            for name, off in (("type_vocab_size", 0), ("pooler", False), ("mlm_head", True)):
                if getattr(self, name) != off:
                    raise _fail(name, getattr(self, name), f"{off!r} for arch={self.arch!r}")

    # ----- derived sizes -------------------------------------------------------------------
    @property
    def projection_bias(self) -> bool:
        """Whether the Q, K, V projections have biases."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads if self.d_head is None else self.d_head

    @property
    def decoder_layers(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    def mixer_at(self, layer: int) -> str:
        """The mixer of layer ``layer`` (from 0): ``mixer``, except the softmax-attention
        layers of a hybrid (``attention_every``)."""
        if self.attention_every is not None and (layer + 1) % self.attention_every == 0:
            return "attention"
        return self.mixer

    @property
    def source_vocab_size(self) -> int:
        return self.vocab_size if self.src_vocab_size is None else self.src_vocab_size

    # ----- serialisation -------------------------------------------------------------------
    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with some fields changed (validated again).  Unknown names raise."""
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(
                f"unknown ModelConfig field(s) {unknown}; expected some of {field_names()}"
            )
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        unknown = sorted(set(data) - set(field_names()))
        if unknown:
            raise ValueError(
                f"unknown ModelConfig field(s) {unknown}; expected some of {field_names()}"
            )
        return cls(**dict(data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"model config is not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise ValueError(f"model config JSON must be an object, got {type(data).__name__}")
        return cls.from_dict(data)


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(ModelConfig)]


# ----- presets ------------------------------------------------------------------------------


def _paper_base() -> ModelConfig:
    """Table 3, "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (about 65M parameters)."""
    return ModelConfig()


def _paper_big() -> ModelConfig:
    """Table 3, "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (about 213M)."""
    return ModelConfig(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)


def _gpt2_small() -> ModelConfig:
    return ModelConfig(
        arch="decoder",
        vocab_size=50257,
        n_layers=12,
        d_model=768,
        n_heads=12,
        d_ff=3072,
        max_len=1024,
        positional="learned",
        norm_position="pre",
        activation="gelu_tanh",
        scale_embeddings=False,
        pad_id=None,
        init="scaled-normal",
    )


def _llama_style_small() -> ModelConfig:
    return ModelConfig(
        arch="decoder",
        vocab_size=32000,
        n_layers=12,
        d_model=768,
        n_heads=12,
        n_kv_heads=4,
        d_ff=2048,
        max_len=2048,
        positional="rope",
        norm="rmsnorm",
        norm_position="pre",
        norm_eps=1e-6,
        activation="swiglu",
        bias=False,
        dropout=0.0,
        scale_embeddings=False,
        tie_embeddings=False,
        pad_id=None,
        init="scaled-normal",
    )


def _bert_base() -> ModelConfig:
    return ModelConfig(
        arch="encoder",
        vocab_size=30522,
        n_layers=12,
        d_model=768,
        n_heads=12,
        d_ff=3072,
        max_len=512,
        positional="learned",
        norm_eps=1e-12,
        activation="gelu",
        scale_embeddings=False,
        pad_id=0,
        init="scaled-normal",
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
        n_heads=64,
        n_kv_heads=8,
        d_ff=28672,
        max_len=8192,
        positional="rope",
        rope_base=500000.0,
        norm="rmsnorm",
        norm_position="pre",
        norm_eps=1e-5,
        activation="swiglu",
        bias=False,
        dropout=0.0,
        scale_embeddings=False,
        tie_embeddings=False,
        pad_id=None,
        init="scaled-normal",
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
    """The named preset's config, with ``overrides`` applied (field names of ModelConfig)."""
    if name not in _PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {', '.join(presets())}")
    return _PRESETS[name]().replace(**overrides)
