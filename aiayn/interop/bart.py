"""Weight conversion between ``EncoderDecoder`` and Hugging
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

from collections.abc import Collection
from typing import Any

from aiayn.config import ModelConfig
from aiayn.interop.hf import (
    NameMap,
    Reading,
    check_fields,
    check_settings,
    copied_from_hf,
    copied_to_hf,
    import_transformers,
)
from aiayn.interop.marian import SHARED_COPIES, marian_names, seq2seq_config, seq2seq_fields
from aiayn.models.encoder_decoder import EncoderDecoder

OFFSET = 2  # BartLearnedPositionalEmbedding: position p is row p + 2
_ACTIVATIONS = {
    "gelu": "gelu",
    "relu": "relu",
    "gelu_new": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
_ACTIVATIONS_BACK = {"gelu": "gelu", "relu": "relu", "gelu_tanh": "gelu_new", "silu": "silu"}


def config_from_bart(hf_config: Any) -> ModelConfig:
    """``BartConfig`` -> a post-LN encoder-decoder with biases, learned positions, an
    embedding norm per stack and tied embeddings."""
    c = hf_config
    check_fields("BartConfig", c, activation_function=tuple(_ACTIVATIONS))
    return seq2seq_config(c, "BartConfig", _ACTIVATIONS[c.activation_function], embedding_norm=True)


def _bart_config(config: ModelConfig, attn_implementation: str | None, **ids: int) -> Any:
    """ModelConfig -> ``BartConfig`` (inverse of ``config_from_bart``)."""
    fields = seq2seq_fields(config, "BART", _ACTIVATIONS_BACK)
    want = "ModelConfig (for BART)"
    check_settings(
        want, config, {"embedding_norm": (True,), "norm_eps": (1e-5,), "type_vocab_size": (0,)}
    )
    pad = config.pad_id if config.pad_id is not None else 1
    eos = ids.get("eos", 2)
    return import_transformers().BartConfig(
        **fields,
        pad_token_id=pad,
        bos_token_id=ids.get("bos", 0),
        eos_token_id=eos,
        decoder_start_token_id=ids.get("start", eos),
        forced_eos_token_id=eos,
        attn_implementation=attn_implementation,
    )


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


def read_bart(hf_config: Any, stored: Collection[str]) -> Reading:
    """A BART folder's config and name map (its copies of ``model.shared`` skipped)."""
    config = config_from_bart(hf_config)
    return Reading(config, bart_names(config), SHARED_COPIES)


def write_bart(config: ModelConfig) -> tuple[Any, NameMap]:
    """The ``BartConfig`` (naming ``BartForConditionalGeneration``) and name map of a folder."""
    hf_config = _bart_config(config, None)
    hf_config.architectures = ["BartForConditionalGeneration"]
    return hf_config, bart_names(config)


def from_hf_bart(hf_model: Any) -> EncoderDecoder:
    """A ``BartForConditionalGeneration`` as an ``EncoderDecoder`` with identical
    weights."""
    config = config_from_bart(hf_model.config)
    return copied_from_hf(EncoderDecoder(config), hf_model, bart_names(config), "BART")


def to_hf_bart(model: EncoderDecoder, *, attn_implementation: str | None = None) -> Any:
    """A ``BartForConditionalGeneration`` with ``model``'s weights (the position tables' two
    unused rows are zeros)."""
    hf_config = _bart_config(model.config, attn_implementation)
    hf_model = import_transformers().BartForConditionalGeneration(hf_config)
    for stack in (hf_model.model.encoder, hf_model.model.decoder):
        stack.embed_positions.weight.data[:OFFSET].zero_()
    return copied_to_hf(model, hf_model, bart_names(model.config), "BART")
