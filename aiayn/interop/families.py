"""The Hugging Face families aiayn reads and writes: one adapter each, in one table.

Everything that depends on the family -- how a folder's ``config.json`` becomes a
``ModelConfig``, the tensor-name map each way, which stored tensors are
copies or computed, which aiayn model it builds, what ``architectures`` a written folder names
-- is looked up here by ``config.json``'s ``model_type`` (``family_of``); nothing else
branches on the family.  The conversions themselves live in one module per family:
gpt2.py, llama.py (Llama, Mistral, Qwen2, Mixtral as its variants), bert.py, marian.py and
bart.py; hf.py holds what they share.  A new family is one such module and one line in ``FAMILIES``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError
from aiayn.interop import bart, bert, gpt2, llama, marian
from aiayn.interop.hf import NameMap, Reading
from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM, TransformerModel


def _computes_nothing(model: TransformerModel, mapped: Collection[str]) -> set[str]:
    return set()


@dataclass(frozen=True)
class Family:
    """One family's adapter.

    ``read(hf_config, stored)``: a folder's ``transformers`` config and the names of the
    tensors it stores -> the aiayn config, name map and skipped tensors; ``write(config)``:
    the HF config (naming its ``architectures``) and name map of a folder written from
    aiayn; ``from_hf``: an HF module -> aiayn, same weights; ``renames``: old stored names ->
    today's (suffixes); ``fill_unstored(model, mapped)``: fill parameters a folder may leave
    out, returning their names."""

    name: str  # as messages name it: "GPT-2"
    model_type: str  # config.json's "model_type"
    model: type[TransformerModel]
    read: Callable[[Any, Collection[str]], Reading]
    write: Callable[[ModelConfig], tuple[Any, NameMap]]
    from_hf: Callable[[Any], TransformerModel]
    renames: tuple[tuple[str, str], ...] = ()
    fill_unstored: Callable[[TransformerModel, Collection[str]], set[str]] = _computes_nothing


def _llama(variant: llama.LlamaVariant) -> Family:
    return Family(
        variant.name,
        variant.name.lower(),
        DecoderLM,
        read=lambda c, stored: llama.read_llama(c, stored, variant),
        write=lambda config: llama.write_llama(config, variant),
        from_hf=lambda m: llama.llama_from_hf(m, variant),
    )


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("GPT-2", "gpt2", DecoderLM, gpt2.read_gpt2, gpt2.write_gpt2, gpt2.from_hf_gpt2),
        _llama(llama.LLAMA),
        _llama(llama.MISTRAL),
        _llama(llama.QWEN2),
        _llama(llama.MIXTRAL),
        Family(
            "BERT",
            "bert",
            EncoderLM,
            bert.read_bert,
            bert.write_bert,
            bert.from_hf_bert,
            renames=bert.LEGACY_NAMES,
        ),
        Family(
            "Marian",
            "marian",
            EncoderDecoder,
            marian.read_marian,
            marian.write_marian,
            marian.from_hf_marian,
            fill_unstored=marian.fill_positions,
        ),
        Family("BART", "bart", EncoderDecoder, bart.read_bart, bart.write_bart, bart.from_hf_bart),
    )
}


def family_of(model_type: object) -> Family:
    """The adapter of ``model_type`` (a folder's ``config.json``, or ``--to-hf``)."""
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise CheckpointError(
            f"model_type={model_type!r} cannot be loaded: supported are {', '.join(FAMILIES)}"
        )
    return FAMILIES[model_type]


def from_hf(hf_model: Any) -> DecoderLM:
    """Any supported Hugging Face causal LM, by its ``config.model_type``."""
    kind = getattr(hf_model.config, "model_type", None)
    causal = {t: f for t, f in FAMILIES.items() if f.model is DecoderLM}
    if kind not in causal:
        raise CheckpointError(
            f"model_type={kind!r} cannot be converted: supported are {', '.join(causal)}"
        )
    model = causal[kind].from_hf(hf_model)
    assert isinstance(model, DecoderLM)
    return model
