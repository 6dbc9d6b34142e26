"""Weight conversion between ``DecoderLM`` and the Hugging Face Llama family: Llama
(``LlamaForCausalLM``), Mistral (the same, with a sliding window), Qwen2 (the same, with
biases on the q, k and v projections) and Mixtral (Mistral with a mixture of experts: HF's
router, softmax over all experts, top k, renormalised, is aiayn/nn/moe.py's).  Each is a
``LlamaVariant`` of one converter, strict both ways (aiayn/interop/hf.py).

Name mapping (per layer ``i``; aiayn <- Llama):

* embed.token <- model.embed_tokens (rotary positions: no weights)
* blocks.i.norm1 <- layers.i.input_layernorm; blocks.i.norm2 <- post_attention_layernorm
* blocks.i.self_attn.qkv <- cat(q_proj, k_proj, v_proj); blocks.i.self_attn.out <- o_proj
* blocks.i.ffn.w13 <- cat(gate_proj, up_proj); blocks.i.ffn.w2 <- down_proj
* blocks.i.ffn.router / experts.e.w13 / experts.e.w2 <- (Mixtral) mlp.gate /
  mlp.experts.gate_up_proj[e] / mlp.experts.down_proj[e]; on the Hub, block_sparse_moe.gate /
  cat(experts.e.w1, experts.e.w3) / experts.e.w2
* decoder.norm <- model.norm; head <- lm_head (unless tie_word_embeddings)
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError
from aiayn.interop.hf import (
    NameMap,
    Reading,
    check_fields,
    check_settings,
    copied_from_hf,
    copied_to_hf,
    experts_layout,
    import_transformers,
)
from aiayn.models.decoder import DecoderLM


@dataclass(frozen=True)
class LlamaVariant:
    """What sets one member of the Llama family apart; HF's classes are ``{name}Config`` and
    ``{name}ForCausalLM``.  ``window``: "never" (Llama), "always" (Mistral's
    ``sliding_window``, on every layer when set) or "opt-in" (Qwen2's, only with
    ``use_sliding_window``)."""

    name: str
    window: Literal["never", "always", "opt-in"]
    qkv_bias: bool = False  # Qwen2Attention: q/k/v_proj with bias, o_proj without
    experts: bool = False  # Mixtral: a router and experts in place of the MLP


LLAMA = LlamaVariant("Llama", "never")


MISTRAL = LlamaVariant("Mistral", "always")


QWEN2 = LlamaVariant("Qwen2", "opt-in", qkv_bias=True)


MIXTRAL = LlamaVariant("Mixtral", "always", experts=True)


def _llama_rope(c: Any) -> tuple[float, float]:
    """(rope_base, rope_scaling) from transformers 5.x ``rope_parameters`` or 4.x
    ``rope_theta`` + ``rope_scaling``.  Only unscaled and linear (position interpolation)."""
    params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    theta = params.get("rope_theta", getattr(c, "rope_theta", None) or 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", None))
    rope = SimpleNamespace(rope_type=kind, partial_rotary_factor=partial)
    check_fields("LlamaConfig.rope_parameters", rope, rope_type=("default", "linear"))
    check_fields("LlamaConfig.rope_parameters", rope, partial_rotary_factor=(None, 1.0))
    return float(theta), float(params["factor"]) if kind == "linear" else 1.0


def _sliding_window(c: Any, variant: LlamaVariant) -> int | None:
    """Mistral's ``sliding_window`` (every layer); Qwen2's only when ``use_sliding_window``,
    which must then cover every layer (aiayn windows all layers or none)."""
    if variant.window == "never":
        return None
    if variant.window == "opt-in":
        if not getattr(c, "use_sliding_window", False):
            return None
        if getattr(c, "max_window_layers", 0) not in (0,):
            raise CheckpointError(
                f"Qwen2Config max_window_layers={c.max_window_layers} cannot be converted: aiayn"
                " windows every layer or none (expected 0 with use_sliding_window)"
            )
    window = getattr(c, "sliding_window", None)
    return int(window) if window else None


def config_from_llama(hf_config: Any, variant: LlamaVariant = LLAMA) -> ModelConfig:
    """``LlamaConfig`` -> RMSNorm, SwiGLU, rotary positions, grouped-query attention, no bias.
    The same family (``variant``): ``MistralConfig`` (+ a sliding window), ``Qwen2Config``
    (+ biases on q, k and v) and ``MixtralConfig`` (+ a mixture of experts)."""
    c = hf_config
    owner = f"{variant.name}Config"
    check_fields(owner, c, hidden_act=("silu",), mlp_bias=(False,))
    experts: dict[str, Any] = {}
    if variant.experts:  # experts of size intermediate_size, the top k mixed (aiayn/nn/moe.py)
        check_fields(owner, c, router_jitter_noise=(0.0, None))
        experts = {"ffn.n_experts": c.num_local_experts, "ffn.top_k": c.num_experts_per_tok}
    qkv_bias: bool | None = None
    if variant.qkv_bias:
        qkv_bias = True
    else:
        check_fields(owner, c, attention_bias=(False,))
    window = _sliding_window(c, variant)
    rope_base, rope_scaling = _llama_rope(c)
    head_dim = getattr(c, "head_dim", None)
    return ModelConfig.from_dict(
        {
            "arch": "decoder",
            "vocab_size": c.vocab_size,
            "n_layers": c.num_hidden_layers,
            "d_model": c.hidden_size,
            "attention.n_heads": c.num_attention_heads,
            "attention.n_kv_heads": c.num_key_value_heads or c.num_attention_heads,
            "attention.d_head": None
            if head_dim in (None, c.hidden_size // c.num_attention_heads)
            else head_dim,
            "ffn.d_ff": c.intermediate_size,
            "max_len": c.max_position_embeddings,
            "positions.scheme": "rope",
            "positions.rope_base": rope_base,
            "positions.rope_scaling": rope_scaling,
            "norm": "rmsnorm",
            "norm_position": "pre",
            "norm_eps": c.rms_norm_eps,
            "ffn.activation": "swiglu",
            "bias": False,
            "dropout": 0.0,
            "attention.dropout": float(getattr(c, "attention_dropout", 0.0) or 0.0),
            "scale_embeddings": False,
            "tie_embeddings": bool(c.tie_word_embeddings),
            "pad_id": None,
            "init_std": c.initializer_range,
            "attention.qkv_bias": qkv_bias,
            "attention.sliding_window": window,
            **experts,
        }
    )


def _llama_config(
    config: ModelConfig, attn_implementation: str | None, variant: LlamaVariant = LLAMA
) -> Any:
    """ModelConfig -> ``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config`` /
    ``MixtralConfig`` (inverse of ``config_from_llama``).  They have no
    embedding/residual dropout, so ``config.dropout`` (training only) is dropped."""
    c = config
    want = f"ModelConfig (for {variant.name})"
    check_settings(
        want,
        c,
        {
            "arch": ("decoder",),
            "positions.scheme": ("rope",),
            "norm": ("rmsnorm",),
            "norm_position": ("pre",),
            "ffn.activation": ("swiglu",),
            "bias": (False,),
            "scale_embeddings": (False,),
            "attention.score": ("dot",),
            "attention.scale": (True,),
            "residual": (True,),
            "mixer.kind": ("attention",),
            "projection_bias": (variant.qkv_bias,),
            "ffn.n_experts": (c.ffn.n_experts,) if variant.experts else (None,),
            "ffn.capacity_factor": (None,),  # HF computes every assignment
        },
    )
    if variant.window == "never":
        check_settings(want, c, {"attention.sliding_window": (None,)})
    p = c.positions
    scaling = None if p.rope_scaling == 1.0 else {"rope_type": "linear", "factor": p.rope_scaling}
    extra: dict[str, Any] = {}
    if variant.window == "always":
        extra["sliding_window"] = c.attention.sliding_window
    if variant.experts:
        if c.ffn.n_experts is None:
            raise CheckpointError(
                "ModelConfig (for Mixtral) n_experts=None: Mixtral is a mixture of experts"
            )
        extra.update(
            num_local_experts=c.ffn.n_experts,
            num_experts_per_tok=c.ffn.top_k,
            router_jitter_noise=0.0,
        )
    elif variant.window == "opt-in":
        window = c.attention.sliding_window is not None
        extra.update(
            use_sliding_window=window,
            sliding_window=c.attention.sliding_window,
            max_window_layers=0 if window else c.n_layers,
        )
    return getattr(import_transformers(), f"{variant.name}Config")(
        **extra,
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.ffn.d_ff,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.attention.n_heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.head_dim,
        hidden_act="silu",
        max_position_embeddings=c.max_len,
        rms_norm_eps=c.norm_eps,
        rope_theta=p.rope_base,
        rope_scaling=scaling,
        attention_dropout=c.attention.dropout,
        initializer_range=c.init_std,
        tie_word_embeddings=c.tie_embeddings,
        attn_implementation=attn_implementation,
    )


def _llama_names(config: ModelConfig, experts: str = "") -> NameMap:
    """Llama's names; Mistral's are the same, Qwen2 adds the q, k, v biases, and Mixtral has
    a router and experts in place of the MLP: ``experts`` "fused" (transformers 5's modules:
    one (E, 2F, C) gate_up_proj and one (E, C, F) down_proj per layer, expert e their slice
    ``[e]``) or "per-expert" (the checkpoints on the Hub: block_sparse_moe.experts.e.w1/w3/w2)."""
    names: NameMap = [
        ("embed.token.weight", ("model.embed_tokens.weight",), False),
        ("decoder.norm.weight", ("model.norm.weight",), False),
    ]
    for i in range(config.n_layers):
        ours, hf = f"decoder.blocks.{i}.", f"model.layers.{i}."
        attn, mlp = f"{hf}self_attn.", f"{hf}mlp."
        names += [
            (f"{ours}norm1.weight", (f"{hf}input_layernorm.weight",), False),
            # (H D + 2 H_kv D, C) = [q_proj (H D, C); k_proj (H_kv D, C); v_proj (H_kv D, C)]
            (f"{ours}self_attn.qkv.weight", tuple(f"{attn}{p}_proj.weight" for p in "qkv"), False),
            *(
                [(f"{ours}self_attn.qkv.bias", tuple(f"{attn}{p}_proj.bias" for p in "qkv"), False)]
                if config.projection_bias
                else []
            ),
            (f"{ours}self_attn.out.weight", (f"{attn}o_proj.weight",), False),
            (f"{ours}norm2.weight", (f"{hf}post_attention_layernorm.weight",), False),
        ]
        if config.ffn.n_experts is None:
            names += [
                # (2 F, C) = [gate_proj (F, C) = W1; up_proj (F, C) = W3]
                (
                    f"{ours}ffn.w13.weight",
                    (f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight"),
                    False,
                ),
                (f"{ours}ffn.w2.weight", (f"{mlp}down_proj.weight",), False),
            ]
            continue
        moe = f"{hf}mlp." if experts == "fused" else f"{hf}block_sparse_moe."
        names.append((f"{ours}ffn.router.weight", (f"{moe}gate.weight",), False))
        for e in range(config.ffn.n_experts):
            mine = f"{ours}ffn.experts.{e}."
            if experts == "fused":  # gate_up_proj[e] is [gate; up] = [W1; W3], our w13
                names += [
                    (f"{mine}w13.weight", (f"{moe}experts.gate_up_proj[{e}]",), False),
                    (f"{mine}w2.weight", (f"{moe}experts.down_proj[{e}]",), False),
                ]
            else:
                x = f"{moe}experts.{e}."
                names += [
                    (f"{mine}w13.weight", (f"{x}w1.weight", f"{x}w3.weight"), False),
                    (f"{mine}w2.weight", (f"{x}w2.weight",), False),
                ]
    if not config.tie_embeddings:
        names.append(("head.weight", ("lm_head.weight",), False))
    return names


def llama_from_hf(hf_model: Any, variant: LlamaVariant) -> DecoderLM:
    """A ``{variant.name}ForCausalLM`` as a ``DecoderLM`` with identical weights."""
    config = config_from_llama(hf_model.config, variant)
    layout = experts_layout(n for n, _ in hf_model.named_parameters())
    return copied_from_hf(DecoderLM(config), hf_model, _llama_names(config, layout), variant.name)


def llama_to_hf(model: DecoderLM, variant: LlamaVariant, attn_implementation: str | None) -> Any:
    """A ``{variant.name}ForCausalLM`` with ``model``'s weights."""
    hf_config = _llama_config(model.config, attn_implementation, variant)
    hf_model = getattr(import_transformers(), f"{variant.name}ForCausalLM")(hf_config)
    layout = experts_layout(n for n, _ in hf_model.named_parameters())
    return copied_to_hf(model, hf_model, _llama_names(model.config, layout), variant.name)


def read_llama(hf_config: Any, stored: Collection[str], variant: LlamaVariant) -> Reading:
    """A Llama-family folder's config and name map (a Mixtral's experts as they are stored)."""
    config = config_from_llama(hf_config, variant)
    return Reading(config, _llama_names(config, experts_layout(stored)))


def write_llama(config: ModelConfig, variant: LlamaVariant) -> tuple[Any, NameMap]:
    """The HF config and name map of a Llama-family folder; a Mixtral's experts in the Hub's
    layout, one w1/w2/w3 per expert, which every transformers version reads."""
    hf_config = _llama_config(config, None, variant)
    hf_config.architectures = [f"{variant.name}ForCausalLM"]
    return hf_config, _llama_names(config, "per-expert")


def from_hf_llama(hf_model: Any) -> DecoderLM:
    """A ``LlamaForCausalLM`` as a ``DecoderLM`` with identical weights."""
    return llama_from_hf(hf_model, LLAMA)


def to_hf_llama(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``LlamaForCausalLM`` with ``model``'s weights (its config must be Llama shaped)."""
    return llama_to_hf(model, LLAMA, attn_implementation)


def to_hf_mistral(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``MistralForCausalLM`` with ``model``'s weights."""
    return llama_to_hf(model, MISTRAL, attn_implementation)


def to_hf_qwen2(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``Qwen2ForCausalLM`` with ``model``'s weights."""
    return llama_to_hf(model, QWEN2, attn_implementation)


def to_hf_mixtral(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``MixtralForCausalLM`` with ``model``'s weights."""
    return llama_to_hf(model, MIXTRAL, attn_implementation)
