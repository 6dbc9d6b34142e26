"""Weight conversion between ``EncoderDecoder`` and Hugging
Face ``MarianMTModel`` (the OPUS-MT translation models).

Marian is the paper's encoder-decoder almost exactly: post-LN, biases everywhere, three-way
tied embeddings scaled by sqrt(d_model) (``scale_embedding``), sinusoidal positions.  Its
differences map onto aiayn's config:

* the feed-forward activation is SiLU ("swish") in the OPUS-MT models: ``activation="silu"``;
* its position tables are stored with the weights (sines in the first half of each vector,
  cosines in the second, where the paper interleaves them); they load as ``positional =
  "learned"`` tables holding exactly Marian's values;
* ``final_logits_bias`` (a buffer, not a parameter) becomes the output projection's bias
  (``head_bias``).

Name mapping (per layer ``i``; aiayn <- HF under ``model.``):

* src_embed.token (= tgt_embed.token = head) <- shared; src/tgt_embed.positions <-
  encoder/decoder.embed_positions
* {encoder,decoder}.blocks.i.self_attn.qkv <- cat(self_attn.q_proj, k_proj, v_proj);
  .out <- self_attn.out_proj; norm1 <- self_attn_layer_norm
* decoder.blocks.i.cross_attn.q <- encoder_attn.q_proj; .kv <- cat(encoder_attn.k_proj,
  v_proj); .out <- encoder_attn.out_proj; norm_cross <- encoder_attn_layer_norm
* ffn.w1 <- fc1; ffn.w2 <- fc2; norm2 <- final_layer_norm
* head.bias <- final_logits_bias[0]

Not handled: separate source and target vocabularies (``share_encoder_decoder_embeddings =
False``) and pre-LN variants (``normalize_before``).  The tokenizer (two SentencePiece models
and a vocabulary) is ``aiayn.data.tokenizer.MarianTokenizer``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError
from aiayn.interop.hf import (
    NameMap,
    Reading,
    check_fields,
    check_settings,
    copied_from_hf,
    copied_to_hf,
    import_transformers,
    weights_and_biases,
)
from aiayn.models.encoder_decoder import EncoderDecoder

_ACTIVATIONS = {
    "swish": "silu",
    "silu": "silu",
    "gelu": "gelu",
    "relu": "relu",
    "gelu_new": "gelu_tanh",
}
_ACTIVATIONS_BACK = {"silu": "swish", "gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new"}
# What a Marian or BART folder may store besides model.shared: copies of it (tied), skipped.
SHARED_COPIES = frozenset(
    {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"}
)
POSITION_TABLES = ("src_embed.positions.weight", "tgt_embed.positions.weight")


def seq2seq_config(hf_config: Any, family: str, activation: str, **fields: Any) -> ModelConfig:
    """What a Marian or BART config (``family`` names it in errors) says of a post-LN
    encoder-decoder with biases, learned position tables and tied embeddings, plus ``fields``."""
    c = hf_config
    if (
        c.encoder_attention_heads != c.decoder_attention_heads
        or c.encoder_ffn_dim != c.decoder_ffn_dim
    ):
        raise CheckpointError(
            f"{family} with different encoder and decoder heads or ffn_dim cannot be"
            " converted: aiayn's stacks share them"
        )
    return ModelConfig.from_dict(
        {
            "arch": "encoder-decoder",
            "vocab_size": c.vocab_size,
            "n_layers": c.encoder_layers,
            "n_decoder_layers": None if c.decoder_layers == c.encoder_layers else c.decoder_layers,
            "d_model": c.d_model,
            "attention.n_heads": c.encoder_attention_heads,
            "ffn.d_ff": c.encoder_ffn_dim,
            "max_len": c.max_position_embeddings,
            "positions.scheme": "learned",
            "norm": "layernorm",
            "norm_position": "post",
            "ffn.activation": activation,
            "bias": True,
            "dropout": c.dropout,
            "attention.dropout": c.attention_dropout,
            "scale_embeddings": bool(c.scale_embedding),
            "tie_embeddings": True,
            "pad_id": c.pad_token_id,
            "head_bias": True,
            "init_std": c.init_std,
            **fields,
        }
    )


def seq2seq_fields(config: ModelConfig, family: str, activations: dict[str, str]) -> dict[str, Any]:
    """The inverse: the HF config fields of a Marian or BART model, after checking that
    ``config`` is one (``activations`` maps aiayn's names to the family's)."""
    c = config
    want = f"ModelConfig (for {family})"
    check_settings(
        want,
        c,
        {
            "arch": ("encoder-decoder",),
            "positions.scheme": ("learned",),
            "norm": ("layernorm",),
            "norm_position": ("post",),
            "ffn.activation": tuple(activations),
            "bias": (True,),
            "tie_embeddings": (True,),
            "head_bias": (True,),
            "kv_heads": (c.attention.n_heads,),
            "head_dim": (c.d_model // c.attention.n_heads,),
            "attention.score": ("dot",),
            "attention.scale": (True,),
            "residual": (True,),
            "ffn.n_experts": (None,),
            "src_vocab_size": (None, c.vocab_size),
        },
    )
    return {
        "vocab_size": c.vocab_size,
        "d_model": c.d_model,
        "encoder_layers": c.n_layers,
        "decoder_layers": c.decoder_layers,
        "encoder_attention_heads": c.attention.n_heads,
        "decoder_attention_heads": c.attention.n_heads,
        "encoder_ffn_dim": c.ffn.d_ff,
        "decoder_ffn_dim": c.ffn.d_ff,
        "activation_function": activations[c.ffn.activation],
        "dropout": c.dropout,
        "attention.dropout": c.attention.dropout,
        "activation_dropout": 0.0,
        "max_position_embeddings": c.max_len,
        "scale_embedding": c.scale_embeddings,
        "init_std": c.init_std,
    }


def config_from_marian(hf_config: Any) -> ModelConfig:
    """``MarianConfig`` -> a post-LN encoder-decoder with biases, tied embeddings and Marian's
    position tables."""
    c = hf_config
    check_fields(
        "MarianConfig", c, activation_function=tuple(_ACTIVATIONS), normalize_before=(False,)
    )
    check_fields(
        "MarianConfig", c, share_encoder_decoder_embeddings=(True,), add_bias_logits=(False,)
    )
    check_fields("MarianConfig", c, decoder_vocab_size=(None, c.vocab_size))
    return seq2seq_config(c, "MarianConfig", _ACTIVATIONS[c.activation_function])


def _marian_config(config: ModelConfig, attn_implementation: str | None, **ids: int) -> Any:
    """ModelConfig -> ``MarianConfig`` (inverse of ``config_from_marian``)."""
    fields = seq2seq_fields(config, "Marian", _ACTIVATIONS_BACK)
    check_settings("ModelConfig (for Marian)", config, {"embedding_norm": (False,)})
    pad = config.pad_id if config.pad_id is not None else config.vocab_size - 1
    return import_transformers().MarianConfig(
        **fields,
        pad_token_id=pad,
        decoder_start_token_id=ids.get("start", pad),
        eos_token_id=ids.get("eos", 0),
        attn_implementation=attn_implementation,
    )


def marian_names(config: ModelConfig) -> NameMap:
    names: NameMap = [
        ("src_embed.token.weight", ("model.shared.weight",), False),
        ("src_embed.positions.weight", ("model.encoder.embed_positions.weight",), False),
        ("tgt_embed.positions.weight", ("model.decoder.embed_positions.weight",), False),
    ]
    stacks = (("encoder", config.n_layers), ("decoder", config.decoder_layers))
    for stack, layers in stacks:
        for i in range(layers):
            modules: list[tuple[str, str | tuple[str, ...]]] = [
                ("self_attn.qkv", tuple(f"self_attn.{p}_proj" for p in "qkv")),
                ("self_attn.out", "self_attn.out_proj"),
                ("norm1", "self_attn_layer_norm"),
                ("ffn.w1", "fc1"),
                ("ffn.w2", "fc2"),
                ("norm2", "final_layer_norm"),
            ]
            if stack == "decoder":
                modules += [
                    ("cross_attn.q", "encoder_attn.q_proj"),
                    ("cross_attn.kv", ("encoder_attn.k_proj", "encoder_attn.v_proj")),
                    ("cross_attn.out", "encoder_attn.out_proj"),
                    ("norm_cross", "encoder_attn_layer_norm"),
                ]
            names += weights_and_biases(
                f"{stack}.blocks.{i}.", f"model.{stack}.layers.{i}.", modules
            )
    return [*names, ("head.bias", ("final_logits_bias[0]",), False)]  # a buffer in HF


def marian_positions(n_positions: int, dim: int) -> torch.Tensor:
    """Marian's (n_positions, dim) sinusoid table: the paper's frequencies, sines in the first
    half of each vector and cosines in the second (MarianSinusoidalPositionalEmbedding).
    Checkpoint folders often leave it out, since it is computed."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    j = torch.arange(dim, dtype=torch.float64)
    angles = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)
    half = dim // 2 + dim % 2
    table = torch.empty(n_positions, dim, dtype=torch.float64)
    table[:, :half] = torch.sin(angles[:, 0::2])
    table[:, half:] = torch.cos(angles[:, 1::2])
    return table.float()


def read_marian(hf_config: Any, stored: Collection[str]) -> Reading:
    """A Marian folder's config and name map; its sinusoid tables are often not stored (they
    are computed: ``fill_positions``)."""
    config = config_from_marian(hf_config)
    names = [
        n for n in marian_names(config) if "embed_positions" not in n[1][0] or n[1][0] in stored
    ]
    return Reading(config, names, SHARED_COPIES)


def fill_positions(model: torch.nn.Module, mapped: Collection[str]) -> set[str]:
    """Fill the position tables a Marian folder leaves out with Marian's sinusoids; the names
    of those filled."""
    params = dict(model.named_parameters())
    computed = set()
    for ours in POSITION_TABLES:
        if ours not in mapped:
            with torch.no_grad():
                params[ours].copy_(marian_positions(*params[ours].shape))
            computed.add(ours)
    return computed


def write_marian(config: ModelConfig) -> tuple[Any, NameMap]:
    """The ``MarianConfig`` (naming ``MarianMTModel``) and name map of a Marian folder."""
    hf_config = _marian_config(config, None)
    hf_config.architectures = ["MarianMTModel"]
    return hf_config, marian_names(config)


def from_hf_marian(hf_model: Any) -> EncoderDecoder:
    """A ``MarianMTModel`` as an ``EncoderDecoder`` with identical weights."""
    config = config_from_marian(hf_model.config)
    return copied_from_hf(EncoderDecoder(config), hf_model, marian_names(config), "Marian")


def to_hf_marian(model: EncoderDecoder, *, attn_implementation: str | None = None) -> Any:
    """A ``MarianMTModel`` with ``model``'s weights."""
    hf_model = import_transformers().MarianMTModel(
        _marian_config(model.config, attn_implementation)
    )
    return copied_to_hf(model, hf_model, marian_names(model.config), "Marian")
