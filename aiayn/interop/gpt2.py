"""Weight conversion between ``DecoderLM`` and Hugging Face GPT-2 (``GPT2LMHeadModel``),
strict both ways (aiayn/interop/hf.py).  Converted models give the same logits as the source
(tests/interop/test_hf.py).

Name mapping (per layer ``i``; aiayn <- GPT-2):

* embed.token <- transformer.wte; embed.positions <- transformer.wpe
* blocks.i.norm1 <- h.i.ln_1; blocks.i.norm2 <- h.i.ln_2
* blocks.i.self_attn.qkv <- h.i.attn.c_attn (Conv1D, transposed)
* blocks.i.self_attn.out <- h.i.attn.c_proj (Conv1D)
* blocks.i.ffn.w1 <- h.i.mlp.c_fc (Conv1D); blocks.i.ffn.w2 <- h.i.mlp.c_proj (Conv1D)
* decoder.norm <- transformer.ln_f; head <- lm_head (tied to wte by default)
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from aiayn.config import Activation, ModelConfig
from aiayn.interop.hf import (
    NameMap,
    Reading,
    check_fields,
    check_settings,
    copied_from_hf,
    copied_to_hf,
    import_transformers,
)
from aiayn.models.decoder import DecoderLM

# GPT2Config.activation_function -> ours ("gelu_new" is GPT-2's tanh approximation of GELU)
_GPT2_ACTIVATIONS: dict[str, Activation] = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


_GPT2_ACTIVATIONS_BACK = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def config_from_gpt2(hf_config: Any) -> ModelConfig:
    """``GPT2Config`` -> decoder-only, pre-LN, learned positions, GELU, biases, tied head."""
    c = hf_config
    check_fields("GPT2Config", c, activation_function=tuple(_GPT2_ACTIVATIONS))
    check_fields("GPT2Config", c, scale_attn_weights=(True,), add_cross_attention=(False,))
    check_fields("GPT2Config", c, scale_attn_by_inverse_layer_idx=(False,))
    return ModelConfig.from_dict(
        {
            "arch": "decoder",
            "vocab_size": c.vocab_size,
            "n_layers": c.n_layer,
            "d_model": c.n_embd,
            "attention.n_heads": c.n_head,
            "ffn.d_ff": c.n_inner or 4 * c.n_embd,
            "max_len": c.n_positions,
            "positions.scheme": "learned",
            "norm": "layernorm",
            "norm_position": "pre",
            "norm_eps": c.layer_norm_epsilon,
            "ffn.activation": _GPT2_ACTIVATIONS[c.activation_function],
            "bias": True,
            "dropout": c.resid_pdrop,
            "attention.dropout": c.attn_pdrop,
            "scale_embeddings": False,
            "tie_embeddings": getattr(c, "tie_word_embeddings", True),
            "pad_id": None,
            "init_std": c.initializer_range,
        }
    )


def _gpt2_config(config: ModelConfig, attn_implementation: str | None) -> Any:
    """ModelConfig -> ``GPT2Config`` (inverse of ``config_from_gpt2``)."""
    c = config
    want = "ModelConfig (for GPT-2)"
    check_settings(
        want,
        c,
        {
            "arch": ("decoder",),
            "positions.scheme": ("learned",),
            "norm": ("layernorm",),
            "norm_position": ("pre",),
            "ffn.activation": tuple(_GPT2_ACTIVATIONS_BACK),
            "bias": (True,),
            "scale_embeddings": (False,),
            "kv_heads": (c.attention.n_heads,),
            "head_dim": (c.d_model // c.attention.n_heads,),
            "attention.score": ("dot",),
            "attention.scale": (True,),
            "residual": (True,),
        },
    )
    # GPT-2's default special token 50256 only exists in its own vocabulary.
    special = {} if c.vocab_size > 50256 else {"bos_token_id": None, "eos_token_id": None}
    return import_transformers().GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_len,
        n_embd=c.d_model,
        n_layer=c.n_layers,
        n_head=c.attention.n_heads,
        n_inner=c.ffn.d_ff,
        activation_function=_GPT2_ACTIVATIONS_BACK[c.ffn.activation],
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.attention.dropout,
        layer_norm_epsilon=c.norm_eps,
        initializer_range=c.init_std,
        tie_word_embeddings=c.tie_embeddings,
        attn_implementation=attn_implementation,
        **special,
    )


def _gpt2_names(config: ModelConfig) -> NameMap:
    # Conv1D stores y = x W + b with W (in, out): our nn.Linear weight (out, in) is W^T.
    # c_attn's columns are [q | k | v], so W^T's rows are [W_q; W_k; W_v] -- our qkv layout.
    names: NameMap = [
        ("embed.token.weight", ("transformer.wte.weight",), False),
        ("embed.positions.weight", ("transformer.wpe.weight",), False),
        ("decoder.norm.weight", ("transformer.ln_f.weight",), False),
        ("decoder.norm.bias", ("transformer.ln_f.bias",), False),
    ]
    for i in range(config.n_layers):
        ours, hf = f"decoder.blocks.{i}.", f"transformer.h.{i}."
        for a, b, is_conv in (
            ("norm1", "ln_1", False),
            ("self_attn.qkv", "attn.c_attn", True),
            ("self_attn.out", "attn.c_proj", True),
            ("norm2", "ln_2", False),
            ("ffn.w1", "mlp.c_fc", True),
            ("ffn.w2", "mlp.c_proj", True),
        ):
            names.append((f"{ours}{a}.weight", (f"{hf}{b}.weight",), is_conv))
            names.append((f"{ours}{a}.bias", (f"{hf}{b}.bias",), False))
    if not config.tie_embeddings:
        names.append(("head.weight", ("lm_head.weight",), False))
    return names


def from_hf_gpt2(hf_model: Any) -> DecoderLM:
    """A ``GPT2LMHeadModel`` as a ``DecoderLM`` with identical weights."""
    config = config_from_gpt2(hf_model.config)
    return copied_from_hf(DecoderLM(config), hf_model, _gpt2_names(config), "GPT-2")


def to_hf_gpt2(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``GPT2LMHeadModel`` with ``model``'s weights (its config must be GPT-2 shaped)."""
    hf_config = _gpt2_config(model.config, attn_implementation)
    hf_model = import_transformers().GPT2LMHeadModel(hf_config)
    return copied_to_hf(model, hf_model, _gpt2_names(model.config), "GPT-2")


def read_gpt2(hf_config: Any, stored: Collection[str]) -> Reading:
    """A GPT-2 folder's config and name map."""
    config = config_from_gpt2(hf_config)
    return Reading(config, _gpt2_names(config))


def write_gpt2(config: ModelConfig) -> tuple[Any, NameMap]:
    """The ``GPT2Config`` (naming ``GPT2LMHeadModel``) and name map of a GPT-2 folder."""
    hf_config = _gpt2_config(config, None)
    hf_config.architectures = ["GPT2LMHeadModel"]
    return hf_config, _gpt2_names(config)
