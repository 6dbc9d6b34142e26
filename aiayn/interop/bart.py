"""Weight conversion between :class:`~aiayn.models.encoder_decoder.EncoderDecoder` and Hugging
Face ``BartForConditionalGeneration`` (BART, Lewis et al., 2019: a denoising encoder-decoder).

BART is the paper's post-LN encoder-decoder with the choices GPT-2 made: GELU feed-forward
layers, learned positions, unscaled embeddings (``scale_embedding = False``) and a LayerNorm
over the summed embeddings of each stack (``layernorm_embedding``).  Each maps onto aiayn's
config: ``activation="gelu"``, ``positional="learned"``, ``scale_embeddings=False``,
``embedding_norm=True`` (one norm per stack: the source and target embeddings are separate
modules), and ``final_logits_bias`` becomes the output projection's bias (``head_bias``), as
for Marian (aiayn/interop/marian.py), whose name map this shares.

One difference is only in the storage: BART's position tables have two rows more than
positions (``BartLearnedPositionalEmbedding``'s offset of 2, a fairseq legacy), and position
p reads row p + 2.  aiayn's table is rows 2 onward (``embed_positions.weight[2:]``); written
back, the two unused rows are zeros.

Not handled: mBART (pre-LN with final norms: another model type) and separate source and
target vocabularies.
"""

from __future__ import annotations

from typing import Any

from aiayn.config import ModelConfig
from aiayn.interop.hf import NameMap, _check, _copy, _transformers
from aiayn.interop.marian import marian_names
from aiayn.models.encoder_decoder import EncoderDecoder

OFFSET = 2  # BartLearnedPositionalEmbedding: position p is row p + 2
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "silu": "silu",
                "swish": "silu"}  # fmt: skip
_ACTIVATIONS_BACK = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "silu"}


def config_from_bart(hf_config: Any) -> ModelConfig:
    """``BartConfig`` -> a post-LN encoder-decoder with biases, learned positions, an
    embedding norm per stack and tied embeddings."""
    c = hf_config
    _check("BartConfig", c, activation_function=tuple(_ACTIVATIONS))
    if (
        c.encoder_attention_heads != c.decoder_attention_heads
        or c.encoder_ffn_dim != c.decoder_ffn_dim
    ):
        raise ValueError(
            "BartConfig with different encoder and decoder heads or ffn_dim cannot be"
            " converted: aiayn's stacks share them"
        )
    return ModelConfig(
        arch="encoder-decoder", vocab_size=c.vocab_size, n_layers=c.encoder_layers,
        n_decoder_layers=None if c.decoder_layers == c.encoder_layers else c.decoder_layers,
        d_model=c.d_model, n_heads=c.encoder_attention_heads, d_ff=c.encoder_ffn_dim,
        max_len=c.max_position_embeddings, positional="learned", norm="layernorm",
        norm_position="post", activation=_ACTIVATIONS[c.activation_function], bias=True,
        dropout=c.dropout, attention_dropout=c.attention_dropout,
        scale_embeddings=bool(c.scale_embedding), embedding_norm=True, tie_embeddings=True,
        pad_id=c.pad_token_id, head_bias=True, init_std=c.init_std,
    )  # fmt: skip


def _bart_config(config: ModelConfig, attn_implementation: str | None, **ids: int) -> Any:
    """ModelConfig -> ``BartConfig`` (inverse of :func:`config_from_bart`)."""
    c = config
    want = "ModelConfig (for BART)"
    _check(want, c, arch=("encoder-decoder",), positional=("learned",), norm=("layernorm",))
    _check(want, c, norm_position=("post",), activation=tuple(_ACTIVATIONS_BACK), bias=(True,))
    _check(want, c, tie_embeddings=(True,), head_bias=(True,), kv_heads=(c.n_heads,))
    _check(want, c, head_dim=(c.d_model // c.n_heads,), attention_score=("dot",))
    _check(want, c, attention_scale=(True,), residual=(True,), n_experts=(None,))
    _check(want, c, embedding_norm=(True,), src_vocab_size=(None, c.vocab_size))
    _check(want, c, norm_eps=(1e-5,), type_vocab_size=(0,))
    pad = c.pad_id if c.pad_id is not None else 1
    return _transformers().BartConfig(
        vocab_size=c.vocab_size, d_model=c.d_model, encoder_layers=c.n_layers,
        decoder_layers=c.decoder_layers, encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads, encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff,
        activation_function=_ACTIVATIONS_BACK[c.activation], dropout=c.dropout,
        attention_dropout=c.attention_dropout, activation_dropout=0.0,
        max_position_embeddings=c.max_len, scale_embedding=c.scale_embeddings,
        init_std=c.init_std, pad_token_id=pad, bos_token_id=ids.get("bos", 0),
        eos_token_id=ids.get("eos", 2), decoder_start_token_id=ids.get("start", 2),
        forced_eos_token_id=ids.get("eos", 2), attn_implementation=attn_implementation,
    )  # fmt: skip


def bart_names(config: ModelConfig) -> NameMap:
    """Marian's map (the same layer names) with BART's offset position tables and its two
    embedding norms."""
    names: NameMap = []
    for ours, hf_names, transposed in marian_names(config):
        if ".positions." in ours:
            hf_names = (f"{hf_names[0]}[{OFFSET}:]",)
        names.append((ours, hf_names, transposed))
    for side, stack in (("src", "encoder"), ("tgt", "decoder")):
        for p in ("weight", "bias"):
            names.append(
                (f"{side}_embed.norm.{p}", (f"model.{stack}.layernorm_embedding.{p}",), False)
            )
    return names


def from_hf_bart(hf_model: Any) -> EncoderDecoder:
    """A ``BartForConditionalGeneration`` as an :class:`EncoderDecoder` with identical
    weights."""
    config = config_from_bart(hf_model.config)
    model = EncoderDecoder(config)
    _copy(model, hf_model, bart_names(config), to_hf=False, family="BART")
    ref = next(hf_model.parameters())
    return model.to(device=ref.device, dtype=ref.dtype).train(hf_model.training)


def to_hf_bart(model: EncoderDecoder, *, attn_implementation: str | None = None) -> Any:
    """A ``BartForConditionalGeneration`` with ``model``'s weights (the position tables' two
    unused rows are zeros)."""
    hf_config = _bart_config(model.config, attn_implementation)
    hf_model = _transformers().BartForConditionalGeneration(hf_config)
    for stack in (hf_model.model.encoder, hf_model.model.decoder):
        stack.embed_positions.weight.data[:OFFSET].zero_()
    _copy(model, hf_model, bart_names(model.config), to_hf=True, family="BART")
    ref = model.head.weight
    return hf_model.to(device=ref.device, dtype=ref.dtype).train(model.training)
