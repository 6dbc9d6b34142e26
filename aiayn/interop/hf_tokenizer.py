"""A Hugging Face folder's tokenizer, as aiayn's: its ``tokenizer.json`` (with the settings
``tokenizer_config.json`` adds), a Marian pair of SentencePiece vocabularies, or a
SentencePiece ``tokenizer.model`` alone, converted."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer
from aiayn.errors import CheckpointError
from aiayn.interop.hf import import_transformers
from aiayn.interop.tokenizer_config import apply_settings, read_settings


def load_hf_tokenizer(directory: str | os.PathLike[str]) -> BPETokenizer | MarianTokenizer:
    """The checkpoint's own tokenizer, from its ``tokenizer.json`` (HF ``tokenizers``: byte-level
    BPE for GPT-2 and Qwen2, SentencePiece-style BPE for Llama and Mistral, WordPiece for BERT),
    with its normaliser, pre-tokeniser and post-processor, changed by ``tokenizer_config.json``
    and ``special_tokens_map.json`` as transformers changes it (lower-casing, special tokens,
    ``add_bos_token`` / ``add_eos_token``: aiayn/interop/tokenizer_config.py) -- so text -> ids
    is what HF's tokenizer gives, special tokens (a Llama BOS) included.

    A folder that ships only a SentencePiece ``tokenizer.model`` is converted the way HF
    converts it (``AutoTokenizer`` with ``sentencepiece``, honouring ``tokenizer_config.json``
    such as ``add_bos_token``), with the model's own normaliser, so that text -> pieces is
    ``SentencePieceProcessor``'s; the result is kept as a ``tokenizer.json`` from then on."""
    from tokenizers import Tokenizer

    folder = Path(directory)
    path = folder / "tokenizer.json"
    marian = [folder / f for f in ("source.spm", "target.spm", "vocab.json")]
    if not path.is_file() and all(f.is_file() for f in marian):  # Marian: two models, one vocab
        try:
            vocab = {str(k): int(v) for k, v in json.loads(marian[2].read_text()).items()}
        except (ValueError, AttributeError) as err:
            raise CheckpointError(f"corrupt Marian vocabulary {marian[2]}: {err}") from err
        return MarianTokenizer(marian[0].read_bytes(), marian[1].read_bytes(), vocab)
    if not path.is_file():
        if (folder / "tokenizer.model").is_file():
            return _from_sentencepiece(folder)
        raise CheckpointError(
            f"{folder} has neither tokenizer.json nor a SentencePiece tokenizer.model"
        )
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:
        raise CheckpointError(f"cannot read the tokenizer {path}: {err}") from err
    settings = read_settings(folder)
    apply_settings(tok, settings)
    return BPETokenizer(
        tok,
        model_max_length=settings.model_max_length,
        chat_template=settings.chat_template,
        special_tokens=settings.special,
    )


def _from_sentencepiece(folder: Path) -> BPETokenizer:
    try:
        import sentencepiece  # noqa: F401  (HF's converter needs it)
    except ImportError as err:
        raise CheckpointError(
            f"{folder} ships only a SentencePiece tokenizer.model: pip install sentencepiece"
            " protobuf to read it"
        ) from err
    try:
        hf = import_transformers().AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as err:
        raise CheckpointError(f"cannot convert {folder / 'tokenizer.model'}: {err}") from err
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise CheckpointError(f"{folder / 'tokenizer.model'}: HF gave no fast tokenizer to keep")
    _normalize_as_sentencepiece(backend, (folder / "tokenizer.model").read_bytes())
    settings = read_settings(folder)  # transformers applied the rest when it converted
    return BPETokenizer(
        backend,
        model_max_length=settings.model_max_length,
        chat_template=settings.chat_template,
        special_tokens=settings.special,
    )


def _normalize_as_sentencepiece(backend: Any, model: bytes) -> None:
    """Give HF's converted tokenizer the SentencePiece model's normaliser, as
    ``SentencePieceProcessor`` applies it.  HF's Llama tokenizer (transformers 5) leaves out the
    model's normaliser spec (its NFKC table, the removal of extra spaces) and adds the dummy
    prefix "▁" only where the text does not already start with a space: " Hi" became "▁Hi",
    where SentencePiece (and so the model's training data) has "▁▁Hi"; and its BPE has no
    unknown piece, so a character neither in the vocabulary nor byte-encodable was dropped
    where SentencePiece gives ``<unk>``.  Changed only where HF escapes spaces with an unsplit
    Metaspace, as it does for Llama and Mistral."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, models, normalizers, pre_tokenizers

    meta = backend.pre_tokenizer
    if not isinstance(meta, pre_tokenizers.Metaspace) or meta.split:
        return
    pb2: Any = sentencepiece_model_pb2  # generated code, untyped
    proto = pb2.ModelProto()
    proto.ParseFromString(model)
    bpe = backend.model
    if isinstance(bpe, models.BPE) and bpe.unk_token is None:
        bpe.unk_token = proto.trainer_spec.unk_piece  # else unknown characters vanish
    spec = proto.normalizer_spec
    steps: list[Any] = []
    if spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(spec.precompiled_charsmap))
    if spec.remove_extra_whitespaces:  # spaces only, after the table has mapped the others
        steps.append(normalizers.Replace(Regex(r"\A +| +\z"), ""))
        steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    if spec.add_dummy_prefix and meta.prepend_scheme != "never":
        steps.append(normalizers.Prepend(meta.replacement))
    steps.append(normalizers.Replace(" ", meta.replacement))
    backend.normalizer = normalizers.Sequence(steps)
    backend.pre_tokenizer = None
