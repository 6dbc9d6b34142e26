"""Hugging Face checkpoint folders in and out: ``config.json`` and ``model.safetensors``, or
sharded ``model-0000x-of-0000N.safetensors`` with ``model.safetensors.index.json``.

Loading reads the config with ``transformers.AutoConfig`` from the local folder (its defaults
are the reference for every field a saved config leaves out; nothing downloads) and builds the
aiayn model with its parameters on the meta device: no memory, no random initialisation.  Each
parameter is then allocated once, in the stored dtype (bf16 stays bf16), and each tensor's
bytes are read from the safetensors file straight into its place -- Q, K and V into their
slices of the fused projection -- with ``readinto`` on the file, so neither a second copy nor
a mapping of the file is ever held.  Peak memory is the model itself (see the README for the
measurement).  Every tensor in the files must find
its place and every parameter must be filled: a missing or extra tensor, or a wrong shape, is
an error naming it, never a partial load.

Saving writes the HF names (the fused projections split again), in shards of at most
``max_shard_bytes``, with the index HF's ``from_pretrained`` reads.

Families: GPT-2, Llama, Mistral, Qwen2, Mixtral (aiayn/interop/hf.py holds their name maps), BERT
(aiayn/interop/bert.py), Marian (aiayn/interop/marian.py) and BART (aiayn/interop/bart.py).  A BERT folder loads with what it holds: the pooler if its weights are
there, the masked-LM head if its weights are there (bert-base-uncased and its kin hold both,
plus a next-sentence head, which is left out).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from aiayn.checkpoint.atomic import write_atomically
from aiayn.checkpoint.bundle import Bundle, load_bundle, save_bundle
from aiayn.config import ModelConfig
from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer
from aiayn.interop.bart import _bart_config, bart_names, config_from_bart
from aiayn.interop.bert import NSP_WEIGHTS, _bert_config, bert_names, config_from_bert
from aiayn.interop.generation_config import read_generation
from aiayn.interop.hf import (
    NameMap,
    _gpt2_config,
    _gpt2_names,
    _llama_config,
    _llama_names,
    _transformers,
    config_from_gpt2,
    config_from_llama,
    split_index,
)
from aiayn.interop.marian import _marian_config, config_from_marian, marian_names, marian_positions
from aiayn.interop.tokenizer_config import apply_settings, read_settings
from aiayn.models import EncoderDecoder, EncoderLM, TransformerModel
from aiayn.models.decoder import DecoderLM

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
FAMILIES = {
    "gpt2": "GPT-2", "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2",
    "mixtral": "Mixtral", "bert": "BERT", "marian": "Marian", "bart": "BART",
}  # fmt: skip
# Buffers older checkpoints carry (GPT-2's causal masks, BERT's position ids), not weights:
# skipped when present.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "embeddings.position_ids")


def _family_of(model_type: str | None) -> str:
    if model_type not in FAMILIES:
        raise ValueError(
            f"model_type={model_type!r} cannot be loaded: supported are {', '.join(FAMILIES)}"
        )
    return FAMILIES[model_type]


def _weight_files(folder: Path) -> dict[str, Path]:
    """HF tensor name -> the file that holds it."""
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as err:
            raise ValueError(f"corrupt index {index}: {err}") from err
        files = {name: folder / file for name, file in weight_map.items()}
        missing = sorted({str(p.name) for p in files.values() if not p.is_file()})
        if missing:
            raise ValueError(f"{index} names shard(s) that are missing: {missing}")
        return files
    single = folder / SINGLE
    if not single.is_file():
        raise ValueError(f"{folder} holds neither {SINGLE} nor {INDEX}")
    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def is_hf_folder(directory: str | os.PathLike[str]) -> bool:
    """A Hugging Face checkpoint folder: its config.json names a ``model_type`` (an aiayn
    checkpoint's config.json is a ModelConfig, which has none)."""
    cfg = Path(directory) / "config.json"
    try:
        return cfg.is_file() and "model_type" in json.loads(cfg.read_text())
    except (ValueError, UnicodeDecodeError):
        return False


def _modern(name: str) -> str:
    """BERT checkpoints converted from TensorFlow name LayerNorm's weight and bias gamma and
    beta (bert-base-uncased does); HF renames them when loading, and so does this."""
    for old, new in (
        (".LayerNorm.gamma", ".LayerNorm.weight"),
        (".LayerNorm.beta", ".LayerNorm.bias"),
    ):
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


def _plan(folder: Path) -> tuple[str, ModelConfig, NameMap, dict[str, Path], dict[str, str]]:
    """(family, aiayn config, name map, HF tensor name -> file, HF name -> the name stored in
    the file where they differ) of an HF folder."""
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} is not a Hugging Face checkpoint folder: no config.json")
    hf_config = _transformers().AutoConfig.from_pretrained(str(folder), local_files_only=True)
    family = _family_of(getattr(hf_config, "model_type", None))
    files = _weight_files(folder)
    stored_as: dict[str, str] = {}
    if family == "BERT":
        stored_as = {_modern(n): n for n in files if _modern(n) != n}
        files = {_modern(n): p for n, p in files.items()}
        prefix = "bert." if any(n.startswith("bert.") for n in files) else ""
        config = config_from_bert(
            hf_config,
            pooler=f"{prefix}pooler.dense.weight" in files,
            mlm_head="cls.predictions.bias" in files,
        )
        ignored = {*NSP_WEIGHTS}
        if config.tie_embeddings:  # a stored copy of the tied decoder is the embedding table
            ignored |= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
        files = {n: p for n, p in files.items() if n not in ignored}
        return family, config, bert_names(config, prefix), files, stored_as
    if family == "Marian":
        config = config_from_marian(hf_config)
        tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "lm_head.weight")  # copies of model.shared  # fmt: skip
        files = {n: p for n, p in files.items() if n not in tied}
        names = marian_names(config)
        # The sinusoid tables are often not stored: they are computed when absent.
        names = [n for n in names if "embed_positions" not in n[1][0] or n[1][0] in files]
        return family, config, names, files, stored_as
    if family == "BART":
        config = config_from_bart(hf_config)
        tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "lm_head.weight")  # copies of model.shared  # fmt: skip
        files = {n: p for n, p in files.items() if n not in tied}
        return family, config, bart_names(config), files, stored_as
    if family == "GPT-2":
        config = config_from_gpt2(hf_config)
        return family, config, _gpt2_names(config), files, stored_as
    config = config_from_llama(hf_config, family)
    if family != "Mixtral":
        return family, config, _llama_names(config), files, stored_as
    # The Hub's Mixtral checkpoints keep one w1/w2/w3 per expert; transformers 5 saves fused.
    layout = "per-expert" if any(".block_sparse_moe." in n for n in files) else "fused"
    return family, config, _llama_names(config, layout), files, stored_as


def read_hf_config(directory: str | os.PathLike[str]) -> ModelConfig:
    """The aiayn config of an HF folder, without reading its weights."""
    return _plan(Path(directory))[1]


def load_hf_folder(directory: str | os.PathLike[str]) -> TransformerModel:
    """An aiayn model from a Hugging Face checkpoint folder (see the module docstring): a
    :class:`DecoderLM`, or an :class:`EncoderLM` for BERT."""
    family, config, names, files, stored_as = _plan(Path(directory))
    headers = {path: _header(path) for path in set(files.values())}
    for name, original in stored_as.items():  # gamma -> weight, beta -> bias
        header = headers[files[name]][1]
        if original in header:
            header[name] = header.pop(original)
    dtype = _stored_dtype(files, headers)
    with _parameters_on_meta():
        model: TransformerModel
        if family == "BERT":
            model = EncoderLM(config)
        elif family in ("Marian", "BART"):
            model = EncoderDecoder(config)
        else:
            model = DecoderLM(config)
    _materialize(model, dtype)
    computed = set()
    if family == "Marian":  # position tables the folder leaves out are Marian's sinusoids
        mapped = {o for o, _, _ in names}
        params = dict(model.named_parameters())
        for ours in ("src_embed.positions.weight", "tgt_embed.positions.weight"):
            if ours not in mapped:
                with torch.no_grad():
                    params[ours].copy_(marian_positions(*params[ours].shape))
                computed.add(ours)
    _fill(model, names, files, headers, family, computed)
    return model.eval()


def load_checkpoint(directory: str | os.PathLike[str]) -> Bundle:
    """Model and tokenizer from an aiayn checkpoint folder or, read in place, a Hugging Face
    one (what every command's ``--checkpoint`` accepts)."""
    folder = Path(directory)
    if not is_hf_folder(folder):
        return load_bundle(folder)
    model = load_hf_folder(folder)
    run = {
        "model": model.config.to_dict(),
        "source": {"huggingface": str(folder)},
        "generation": read_generation(folder).to_dict(),  # BOS / PAD / EOS ids
    }
    return Bundle(model, load_hf_tokenizer(folder), run, folder)


_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64}  # fmt: skip


def _header(path: Path) -> tuple[int, dict[str, Any]]:
    """(where the data starts, the JSON header) of a safetensors file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100 * 2**20:
            raise ValueError(f"{path} is not a safetensors file (header size {size})")
        try:
            header = json.loads(f.read(size))
        except ValueError as err:
            raise ValueError(f"corrupt safetensors header in {path}: {err}") from err
    header.pop("__metadata__", None)
    return 8 + size, header


def _stored_dtype(
    files: dict[str, Path], headers: dict[Path, tuple[int, dict[str, Any]]]
) -> torch.dtype:
    """The floating dtype most of the stored weights have (bf16 stays bf16); buffers and
    integer tensors do not count."""
    size: dict[torch.dtype, int] = {}
    for name, path in files.items():
        meta = headers[path][1].get(name)
        if meta is None:
            raise ValueError(f"{path.name} does not hold {name}, which its index names")
        dtype = _DTYPES.get(meta["dtype"])
        if dtype is not None and not name.endswith(IGNORED_SUFFIXES):
            begin, end = meta["data_offsets"]
            size[dtype] = size.get(dtype, 0) + end - begin
    if not size:
        raise ValueError(f"no floating-point weights stored (expected one of {list(_DTYPES)})")
    return max(size, key=lambda d: size[d])


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Within the block, new modules put their parameters on the meta device (no memory, and
    initialisers do nothing); buffers -- position tables, computed from the config -- stay
    real."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _materialize(model: nn.Module, dtype: torch.dtype) -> None:
    """Give every meta parameter uninitialised memory of ``dtype`` (tied parameters stay one)."""
    done: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in done:
                done[id(param)] = nn.Parameter(
                    torch.empty(param.shape, dtype=dtype), requires_grad=param.requires_grad
                )
            module._parameters[name] = done[id(param)]


@torch.no_grad()
def _fill(
    model: TransformerModel,
    names: NameMap,
    files: dict[str, Path],
    headers: dict[Path, tuple[int, dict[str, Any]]],
    family: str,
    computed: Collection[str] = (),
) -> None:
    params = dict(model.named_parameters())  # tied tensors appear once
    wanted = {split_index(h)[0] for _, hs, _ in names for h in hs}
    stored = {n for n in files if not n.endswith(IGNORED_SUFFIXES)}
    extra, missing = sorted(stored - wanted), sorted(wanted - stored)
    if extra or missing:
        raise ValueError(
            f"{family} checkpoint does not match its config: tensors not expected {extra[:8]},"
            f" tensors missing {missing[:8]}"
        )
    unmapped = sorted(set(params) - {o for o, _, _ in names} - set(computed))
    if unmapped:
        raise ValueError(f"{family} checkpoint leaves aiayn weights unfilled: {unmapped[:8]}")
    handles: dict[Path, Any] = {}
    try:
        for ours, hf_names, transposed in names:
            dst = params[ours]
            offset = 0
            for h in hf_names:
                base, index = split_index(h)  # expert e of a fused (E, ...) tensor: slice e
                path = files[base]
                start, header = headers[path]
                meta = dict(header[base])
                if index is not None:
                    whole, (begin, end) = meta["shape"], meta["data_offsets"]
                    step = (end - begin) // whole[0]
                    if isinstance(index, slice):  # rows from index.start on
                        first = index.start or 0
                        meta.update(shape=[whole[0] - first, *whole[1:]],
                                    data_offsets=[begin + first * step, end])  # fmt: skip
                    else:
                        meta.update(shape=whole[1:], data_offsets=[begin + index * step,
                                                                    begin + (index + 1) * step])  # fmt: skip
                shape = tuple(meta["shape"])
                if transposed:
                    shape = shape[::-1]
                rows = shape[0] if shape else 1
                if offset + rows > dst.shape[0] or shape[1:] != tuple(dst.shape[1:]):
                    raise ValueError(
                        f"tensor {h}: shape {tuple(meta['shape'])} does not fit {ours}"
                        f" {tuple(dst.shape)} at row {offset}"
                    )
                if path not in handles:
                    handles[path] = open(path, "rb")  # noqa: SIM115
                f = handles[path]
                begin, end = meta["data_offsets"]
                dtype = _DTYPES.get(meta["dtype"])
                part = dst[offset : offset + rows]
                f.seek(start + begin)
                if dtype == dst.dtype and not transposed:  # straight into the parameter
                    buf = part.view(-1).view(torch.uint8)
                    if end - begin != buf.numel() or f.readinto(buf.numpy()) != buf.numel():
                        raise ValueError(f"tensor {h} in {path}: {end - begin} bytes, truncated?")
                else:  # a stored layout or dtype of its own: one tensor's copy, then converted
                    if dtype is None:
                        raise ValueError(f"tensor {h} has dtype {meta['dtype']}")
                    raw = bytearray(end - begin)
                    if f.readinto(raw) != len(raw):
                        raise ValueError(f"tensor {h} in {path} is truncated")
                    t = torch.frombuffer(raw, dtype=dtype).view(tuple(meta["shape"]))
                    part.copy_(t.t() if transposed else t)
                offset += rows
            if offset != dst.shape[0]:
                raise ValueError(
                    f"{ours} <- {', '.join(hf_names)}: {offset} rows filled, expected"
                    f" {dst.shape[0]}"
                )
    finally:
        for handle in handles.values():
            handle.close()


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
            raise ValueError(f"corrupt Marian vocabulary {marian[2]}: {err}") from err
        return MarianTokenizer(marian[0].read_bytes(), marian[1].read_bytes(), vocab)
    if not path.is_file():
        if (folder / "tokenizer.model").is_file():
            return _from_sentencepiece(folder)
        raise ValueError(f"{folder} has neither tokenizer.json nor a SentencePiece tokenizer.model")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as err:
        raise ValueError(f"cannot read the tokenizer {path}: {err}") from err
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
        raise ValueError(
            f"{folder} ships only a SentencePiece tokenizer.model: pip install sentencepiece"
            " protobuf to read it"
        ) from err
    try:
        hf = _transformers().AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as err:
        raise ValueError(f"cannot convert {folder / 'tokenizer.model'}: {err}") from err
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{folder / 'tokenizer.model'}: HF gave no fast tokenizer to keep")
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


def convert_from_hf(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """An HF checkpoint folder as an aiayn checkpoint (model, tokenizer, run.json): what
    ``aiayn generate``, ``evaluate`` and ``explore`` read."""
    model = load_hf_folder(directory)
    tokenizer = load_hf_tokenizer(directory)
    if tokenizer.vocab_size > model.config.vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} tokens, more than the model's"
            f" vocab_size={model.config.vocab_size}"
        )
    run = {"model": model.config.to_dict(), "source": {"huggingface": str(Path(directory))}}
    return save_bundle(out, model, tokenizer, run)


def save_hf_folder(
    model: TransformerModel,
    directory: str | os.PathLike[str],
    family: str,
    *,
    tokenizer: BPETokenizer | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> Path:
    """Write ``model`` as a Hugging Face ``family`` checkpoint folder ("gpt2", "llama",
    "mistral", "qwen2", "mixtral", "bert", "marian", "bart"), atomically; shards of at most ``max_shard_bytes`` with an
    index, and the tokenizer as ``tokenizer.json`` when given."""
    name = _family_of(family)
    if name == "BART":
        hf_config = _bart_config(model.config, None)
        names = bart_names(model.config)
        architecture = "BartForConditionalGeneration"
    elif name == "Marian":
        hf_config = _marian_config(model.config, None)
        names = marian_names(model.config)
        architecture = "MarianMTModel"
    elif name == "BERT":
        hf_config = _bert_config(model.config, None)
        prefix = "bert." if model.config.mlm_head else ""
        names = bert_names(model.config, prefix)
        architecture = "BertForMaskedLM" if model.config.mlm_head else "BertModel"
    elif name == "GPT-2":
        hf_config = _gpt2_config(model.config, None)
        names = _gpt2_names(model.config)
        architecture = "GPT2LMHeadModel"
    else:
        hf_config = _llama_config(model.config, None, name)
        # Mixtral in the Hub's layout, one w1/w2/w3 per expert, which every version reads.
        names = _llama_names(model.config, "per-expert")
        architecture = f"{name.replace('-', '')}ForCausalLM"
    hf_config.architectures = [architecture]
    params = dict(model.named_parameters())
    tensors: dict[str, torch.Tensor] = {}
    for ours, hf_names, transposed in names:
        whole = params[ours].detach()
        sizes = _split_sizes(model, ours, len(hf_names))
        for h, part in zip(hf_names, whole.split(sizes, dim=0), strict=True):
            tensors[h] = (part.t() if transposed else part).contiguous().cpu()
    indexed: dict[str, dict[int, torch.Tensor]] = {}
    for h in [h for h in tensors if h.endswith("]")]:  # slices of one HF tensor: stack them
        base, index = split_index(h)
        part = tensors.pop(h)
        if isinstance(index, slice):  # rows from index.start on: the rows before are zeros
            first = index.start or 0
            tensors[base] = torch.cat([part.new_zeros(first, *part.shape[1:]), part])
        else:
            indexed.setdefault(base, {})[int(index or 0)] = part
    for base, parts in indexed.items():
        tensors[base] = torch.stack([parts[i] for i in sorted(parts)]).contiguous()
    stored = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    major = int(_transformers().__version__.split(".")[0])
    setattr(hf_config, "dtype" if major >= 5 else "torch_dtype", stored)  # renamed in 5.0

    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text(hf_config.to_json_string())
        if tokenizer is not None:
            tokenizer.tok.save(str(tmp / "tokenizer.json"))
        shards: list[dict[str, torch.Tensor]] = [{}]
        size = 0
        for h, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][h] = t
            size += nbytes
        if len(shards) == 1:
            save_file(shards[0], str(tmp / SINGLE), metadata={"format": "pt"})
            return
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(tmp / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (tmp / INDEX).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )

    return write_atomically(Path(directory), fill)


def _split_sizes(model: TransformerModel, ours: str, parts: int) -> list[int]:
    """Rows of each HF tensor in one of ours: q, k, v in the fused projection; gate and up in
    SwiGLU's w13; a plain tensor whole."""
    c = model.config
    rows = dict(model.named_parameters())[ours].shape[0]
    if parts == 1:
        return [rows]
    if ours.endswith(("qkv.weight", "qkv.bias")):
        q, kv = c.n_heads * c.head_dim, c.kv_heads * c.head_dim
        if rows == q + 2 * kv:
            return [q, kv, kv]
    return [rows // parts] * parts
