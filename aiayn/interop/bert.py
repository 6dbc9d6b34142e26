"""Weight conversion between ``EncoderLM`` and Hugging Face BERT:
``BertModel`` (encoder and pooler, for sentence embeddings) and ``BertForMaskedLM``
(encoder and masked-LM head).

BERT is the paper's encoder (post-LN, GELU, learned positions) with three additions that
aiayn's config expresses: token-type (segment) embeddings (``type_vocab_size``), a LayerNorm
over the summed embeddings (``embedding_norm``), and the pooler, tanh(W h_[CLS] + b)
(``pooler``).  A ``BertModel`` has no masked-LM head (``mlm_head=False``).

Name mapping (per layer ``i``; aiayn <- HF, under ``bert.`` in BertForMaskedLM):

* embed.token / embed.positions / embed.token_type <- embeddings.word_embeddings /
  position_embeddings / token_type_embeddings; embed.norm <- embeddings.LayerNorm
* encoder.blocks.i.self_attn.qkv <- cat(attention.self.query, key, value)
* encoder.blocks.i.self_attn.out <- attention.output.dense; norm1 <- attention.output.LayerNorm
* encoder.blocks.i.ffn.w1 <- intermediate.dense; ffn.w2 <- output.dense; norm2 <-
  output.LayerNorm
* pooler <- pooler.dense
* head.dense / head.norm / head.proj.bias <- cls.predictions.transform.dense /
  transform.LayerNorm / cls.predictions.bias; head.proj.weight is tied to the word embeddings

Strict both ways, as for the decoders (aiayn/interop/hf.py, gpt2.py, llama.py): every weight mapped exactly once.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

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
from aiayn.models.encoder import EncoderLM

_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_ACTIVATIONS_BACK = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
# The next-sentence head of BertForPreTraining checkpoints (bert-base-uncased and its kin):
# aiayn has no use for it; a folder that holds it loads without it.
NSP_WEIGHTS = ("cls.seq_relationship.weight", "cls.seq_relationship.bias")
# BERT checkpoints converted from TensorFlow name LayerNorm's weight and bias gamma and beta
# (bert-base-uncased does); HF renames them when loading, and so does a folder's reading.
LEGACY_NAMES = ((".LayerNorm.gamma", ".LayerNorm.weight"), (".LayerNorm.beta", ".LayerNorm.bias"))


def config_from_bert(hf_config: Any, *, pooler: bool, mlm_head: bool) -> ModelConfig:
    """``BertConfig`` -> an encoder: post-LN, learned positions, GELU, token types, a norm
    over the embeddings; with the pooler and/or the masked-LM head."""
    c = hf_config
    check_fields("BertConfig", c, hidden_act=tuple(_ACTIVATIONS), is_decoder=(False,))
    check_fields(
        "BertConfig", c, add_cross_attention=(False,), position_embedding_type=("absolute",)
    )
    return ModelConfig.from_dict(
        {
            "arch": "encoder",
            "vocab_size": c.vocab_size,
            "n_layers": c.num_hidden_layers,
            "d_model": c.hidden_size,
            "attention.n_heads": c.num_attention_heads,
            "ffn.d_ff": c.intermediate_size,
            "max_len": c.max_position_embeddings,
            "positions.scheme": "learned",
            "norm": "layernorm",
            "norm_position": "post",
            "norm_eps": c.layer_norm_eps,
            "ffn.activation": _ACTIVATIONS[c.hidden_act],
            "bias": True,
            "dropout": c.hidden_dropout_prob,
            "attention.dropout": c.attention_probs_dropout_prob,
            "scale_embeddings": False,
            "tie_embeddings": getattr(c, "tie_word_embeddings", True),
            "pad_id": c.pad_token_id,
            "type_vocab_size": c.type_vocab_size,
            "embedding_norm": True,
            "pooler": pooler,
            "mlm_head": mlm_head,
            "init_std": c.initializer_range,
        }
    )


def _bert_config(config: ModelConfig, attn_implementation: str | None) -> Any:
    """ModelConfig -> ``BertConfig`` (inverse of ``config_from_bert``)."""
    c = config
    want = "ModelConfig (for BERT)"
    check_settings(
        want,
        c,
        {
            "arch": ("encoder",),
            "positions.scheme": ("learned",),
            "norm": ("layernorm",),
            "norm_position": ("post",),
            "ffn.activation": tuple(_ACTIVATIONS_BACK),
            "bias": (True,),
        },
    )
    heads = c.attention.n_heads
    check_settings(
        want,
        c,
        {
            "scale_embeddings": (False,),
            "kv_heads": (heads,),
            "embedding_norm": (True,),
            "head_dim": (c.d_model // heads,),
            "attention.score": ("dot",),
            "attention.scale": (True,),
            "residual": (True,),
            "ffn.n_experts": (None,),
        },
    )
    return import_transformers().BertConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.attention.n_heads,
        intermediate_size=c.ffn.d_ff,
        hidden_act=_ACTIVATIONS_BACK[c.ffn.activation],
        hidden_dropout_prob=c.dropout,
        attention_probs_dropout_prob=c.attention.dropout,
        max_position_embeddings=c.max_len,
        type_vocab_size=max(1, c.type_vocab_size),
        layer_norm_eps=c.norm_eps,
        pad_token_id=c.pad_id if c.pad_id is not None else 0,
        initializer_range=c.init_std,
        tie_word_embeddings=c.tie_embeddings,
        attn_implementation=attn_implementation,
    )


def bert_names(config: ModelConfig, prefix: str) -> NameMap:
    """aiayn <-> HF names; ``prefix`` is "bert." inside BertForMaskedLM, "" in BertModel."""
    e = f"{prefix}embeddings."
    names: NameMap = [
        ("embed.token.weight", (f"{e}word_embeddings.weight",), False),
        ("embed.positions.weight", (f"{e}position_embeddings.weight",), False),
        ("embed.norm.weight", (f"{e}LayerNorm.weight",), False),
        ("embed.norm.bias", (f"{e}LayerNorm.bias",), False),
    ]
    if config.type_vocab_size:
        names.append(("embed.token_type.weight", (f"{e}token_type_embeddings.weight",), False))
    for i in range(config.n_layers):
        hf = f"{prefix}encoder.layer.{i}."
        names += weights_and_biases(
            f"encoder.blocks.{i}.",
            hf,
            [
                ("self_attn.qkv", tuple(f"attention.self.{p}" for p in ("query", "key", "value"))),
                ("self_attn.out", "attention.output.dense"),
                ("norm1", "attention.output.LayerNorm"),
                ("ffn.w1", "intermediate.dense"),
                ("ffn.w2", "output.dense"),
                ("norm2", "output.LayerNorm"),
            ],
        )
    if config.pooler:
        names += weights_and_biases("", prefix, [("pooler", "pooler.dense")])
    if config.mlm_head:
        t = "cls.predictions.transform."
        names += [
            ("head.dense.weight", (f"{t}dense.weight",), False),
            ("head.dense.bias", (f"{t}dense.bias",), False),
            ("head.norm.weight", (f"{t}LayerNorm.weight",), False),
            ("head.norm.bias", (f"{t}LayerNorm.bias",), False),
            ("head.proj.bias", ("cls.predictions.bias",), False),
        ]
        if not config.tie_embeddings:
            names.append(("head.proj.weight", ("cls.predictions.decoder.weight",), False))
    return names


def read_bert(hf_config: Any, stored: Collection[str]) -> Reading:
    """A BERT folder loads with what it holds: the pooler if its weights are there, the
    masked-LM head if its weights are there (under ``bert.``); a next-sentence head, and a
    stored copy of the tied decoder (the embedding table), are left out."""
    prefix = "bert." if any(n.startswith("bert.") for n in stored) else ""
    config = config_from_bert(
        hf_config,
        pooler=f"{prefix}pooler.dense.weight" in stored,
        mlm_head="cls.predictions.bias" in stored,
    )
    skipped = {*NSP_WEIGHTS}
    if config.tie_embeddings:
        skipped |= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    return Reading(config, bert_names(config, prefix), frozenset(skipped))


def write_bert(config: ModelConfig) -> tuple[Any, NameMap]:
    """The ``BertConfig`` and name map of a folder: ``BertForMaskedLM`` with the masked-LM
    head, ``BertModel`` without."""
    hf_config = _bert_config(config, None)
    hf_config.architectures = ["BertForMaskedLM" if config.mlm_head else "BertModel"]
    return hf_config, bert_names(config, "bert." if config.mlm_head else "")


def _kind(hf_model: Any) -> tuple[bool, bool, str]:
    """(pooler, mlm_head, name prefix) of a BertModel or BertForMaskedLM."""
    name = type(hf_model).__name__
    if name == "BertForMaskedLM":
        return False, True, "bert."
    if name == "BertModel":
        return hf_model.pooler is not None, False, ""
    raise CheckpointError(f"{name} cannot be converted: BertModel and BertForMaskedLM can")


def from_hf_bert(hf_model: Any) -> EncoderLM:
    """A ``BertModel`` or ``BertForMaskedLM`` as an ``EncoderLM`` with identical weights."""
    pooler, mlm_head, prefix = _kind(hf_model)
    config = config_from_bert(hf_model.config, pooler=pooler, mlm_head=mlm_head)
    return copied_from_hf(EncoderLM(config), hf_model, bert_names(config, prefix), "BERT")


def to_hf_bert(model: EncoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``BertForMaskedLM`` (a model with the masked-LM head) or a ``BertModel`` (one
    without it) with ``model``'s weights."""
    c = model.config
    transformers = import_transformers()
    hf_config = _bert_config(c, attn_implementation)
    if c.mlm_head:
        if c.pooler:
            raise CheckpointError(
                "a BERT with both the pooler and the masked-LM head has no single HF module"
                " here: save it as a folder (aiayn.interop.hf_folder), or drop one"
            )
        hf_model, prefix = transformers.BertForMaskedLM(hf_config), "bert."
    else:
        hf_model, prefix = transformers.BertModel(hf_config, add_pooling_layer=c.pooler), ""
    return copied_to_hf(model, hf_model, bert_names(c, prefix), "BERT")
