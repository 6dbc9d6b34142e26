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

Families: GPT-2, Llama, Mistral, Qwen2, Mixtral, BERT, Marian and BART, each an adapter in
aiayn/interop/families.py, found by ``config.json``'s ``model_type``; this module only asks
the adapter.  A BERT folder loads with what it holds: the pooler if its weights are there,
the masked-LM head if its weights are there (bert-base-uncased and its kin hold both, plus a
next-sentence head, which is left out).

``aiayn.checkpoint.load`` reads an HF folder through ``load_hf``, and
``aiayn.checkpoint.convert_from_hf`` writes one as an aiayn checkpoint; this package sits below
``checkpoint`` and imports nothing of it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from io import BufferedReader
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from aiayn.atomic import inside, write_atomically
from aiayn.config import ModelConfig
from aiayn.data.tokenizer import BPETokenizer, Tokenizer
from aiayn.errors import CheckpointError
from aiayn.interop.families import Family, family_of
from aiayn.interop.generation_config import read_generation
from aiayn.interop.hf import NameMap, Reading, import_transformers, split_index
from aiayn.interop.hf_tokenizer import load_hf_tokenizer
from aiayn.interop.json_files import read_json_object
from aiayn.models import TransformerModel

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# Buffers older checkpoints carry (GPT-2's causal masks, BERT's position ids), not weights:
# skipped when present.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "embeddings.position_ids")


def _weight_files(folder: Path) -> dict[str, Path]:
    """HF tensor name -> the file that holds it."""
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"corrupt index {index}: {err}") from err
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"corrupt index {index}: weight_map is not an object")
        where = f"{index} (weight_map)"
        files = {name: inside(folder, file, where) for name, file in weight_map.items()}
        missing = sorted({str(p.name) for p in files.values() if not p.is_file()})
        if missing:
            raise CheckpointError(f"{index} names shard(s) that are missing: {missing}")
        return files
    single = folder / SINGLE
    if not single.is_file():
        raise CheckpointError(f"{folder} holds neither {SINGLE} nor {INDEX}")
    with safe_open(str(single), framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def _renamed(name: str, renames: tuple[tuple[str, str], ...]) -> str:
    """``name`` with an old suffix replaced by today's (BERT's gamma/beta), as HF renames it
    when loading."""
    for old, new in renames:
        if name.endswith(old):
            return name[: -len(old)] + new
    return name


def _plan(folder: Path) -> tuple[Family, Reading, dict[str, Path], dict[str, str]]:
    """(family, what the folder holds in aiayn's terms, HF tensor name -> file, HF name ->
    the name stored in the file where they differ) of an HF folder."""
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} is not a Hugging Face checkpoint folder: no config.json")
    family = family_of(read_json_object(folder / "config.json").get("model_type"))
    hf_config = import_transformers().AutoConfig.from_pretrained(str(folder), local_files_only=True)
    files = _weight_files(folder)
    stored_as: dict[str, str] = {}
    if family.renames:
        renamed = {n: _renamed(n, family.renames) for n in files}
        stored_as = {new: old for old, new in renamed.items() if new != old}
        files = {renamed[n]: p for n, p in files.items()}
    reading = family.read(hf_config, files.keys())
    files = {n: p for n, p in files.items() if n not in reading.skipped}
    return family, reading, files, stored_as


def read_hf_config(directory: str | os.PathLike[str]) -> ModelConfig:
    """The aiayn config of an HF folder, without reading its weights."""
    return _plan(Path(directory))[1].config


def load_hf_folder(directory: str | os.PathLike[str]) -> TransformerModel:
    """An aiayn model from a Hugging Face checkpoint folder (see the module docstring): the
    model class its family's adapter names (a ``DecoderLM``, an ``EncoderLM`` for BERT, an
    ``EncoderDecoder`` for Marian and BART)."""
    family, reading, files, stored_as = _plan(Path(directory))
    headers = {path: _header(path) for path in set(files.values())}
    for name, original in stored_as.items():  # gamma -> weight, beta -> bias
        header = headers[files[name]][1]
        if original in header:
            header[name] = header.pop(original)
    dtype = _stored_dtype(files, headers)
    with _parameters_on_meta():
        model = family.model(reading.config)
    _materialize(model, dtype)
    computed = family.fill_unstored(model, {o for o, _, _ in reading.names})
    _fill(model, reading.names, files, headers, family.name, computed)
    return model.eval()


def load_hf(directory: str | os.PathLike[str]) -> tuple[TransformerModel, Tokenizer, dict]:
    """Model, tokenizer and run config (with the generation ids: BOS / PAD / EOS) of a
    Hugging Face folder, read in place: what ``aiayn.checkpoint.load`` makes a ``Bundle`` of."""
    folder = Path(directory)
    model = load_hf_folder(folder)
    run = {
        "model": model.config.to_dict(),
        "source": {"huggingface": str(folder)},
        "generation": read_generation(folder).to_dict(),
    }
    return model, load_hf_tokenizer(folder), run


_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}


def _header(path: Path) -> tuple[int, dict[str, Any]]:
    """(where the data starts, the JSON header) of a safetensors file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size < 100 * 2**20:
            raise CheckpointError(f"{path} is not a safetensors file (header size {size})")
        try:
            header = json.loads(f.read(size))
        except ValueError as err:
            raise CheckpointError(f"corrupt safetensors header in {path}: {err}") from err
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
            raise CheckpointError(f"{path.name} does not hold {name}, which its index names")
        dtype = _DTYPES.get(meta["dtype"])
        if dtype is not None and not name.endswith(IGNORED_SUFFIXES):
            begin, end = meta["data_offsets"]
            size[dtype] = size.get(dtype, 0) + end - begin
    if not size:
        raise CheckpointError(f"no floating-point weights stored (expected one of {list(_DTYPES)})")
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


def _check_coverage(
    params: Mapping[str, Tensor],
    names: NameMap,
    files: dict[str, Path],
    family: str,
    computed: Collection[str],
) -> None:
    """Raise CheckpointError unless the stored tensors are exactly those ``names`` reads and
    every parameter of the model is read (or ``computed`` from others)."""
    wanted = {split_index(h)[0] for _, hs, _ in names for h in hs}
    stored = {n for n in files if not n.endswith(IGNORED_SUFFIXES)}
    extra, missing = sorted(stored - wanted), sorted(wanted - stored)
    if extra or missing:
        raise CheckpointError(
            f"{family} checkpoint does not match its config: tensors not expected {extra[:8]},"
            f" tensors missing {missing[:8]}"
        )
    unmapped = sorted(set(params) - {o for o, _, _ in names} - set(computed))
    if unmapped:
        raise CheckpointError(f"{family} checkpoint leaves aiayn weights unfilled: {unmapped[:8]}")


def _sliced(meta: dict[str, Any], index: int | slice | None) -> dict[str, Any]:
    """The header entry of ``index`` of a fused (E, ...) tensor: expert e, or the rows from
    ``index.start`` on; the whole tensor's when ``index`` is None."""
    if index is None:
        return meta
    whole, (begin, end) = meta["shape"], meta["data_offsets"]
    step = (end - begin) // whole[0]
    if isinstance(index, slice):
        first = index.start or 0
        return meta | {
            "shape": [whole[0] - first, *whole[1:]],
            "data_offsets": [begin + first * step, end],
        }
    return meta | {
        "shape": whole[1:],
        "data_offsets": [begin + index * step, begin + (index + 1) * step],
    }


def _read_into(
    part: Tensor, f: BufferedReader, start: int, meta: dict[str, Any], transposed: bool, where: str
) -> None:
    """Read the tensor ``meta`` describes (its data at ``start`` + its offsets in ``f``) into
    ``part``: straight into its memory when the dtype and layout match, else through one
    converted copy.  ``where`` names the tensor and file in errors."""
    begin, end = meta["data_offsets"]
    dtype = _DTYPES.get(meta["dtype"])
    f.seek(start + begin)
    if dtype == part.dtype and not transposed:  # straight into the parameter
        buf = part.view(-1).view(torch.uint8)
        view = buf.numpy().data  # the parameter's bytes, written in place by readinto
        if end - begin != buf.numel() or f.readinto(view) != buf.numel():
            raise CheckpointError(f"tensor {where}: {end - begin} bytes, truncated?")
        return
    if dtype is None:
        raise CheckpointError(f"tensor {where} has dtype {meta['dtype']}")
    raw = bytearray(end - begin)
    if f.readinto(raw) != len(raw):
        raise CheckpointError(f"tensor {where} is truncated")
    t = torch.frombuffer(raw, dtype=dtype).view(tuple(meta["shape"]))
    part.copy_(t.t() if transposed else t)


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
    _check_coverage(params, names, files, family, computed)
    with ExitStack() as handles:
        opened: dict[Path, BufferedReader] = {}
        for ours, hf_names, transposed in names:
            dst = params[ours]
            offset = 0
            for h in hf_names:
                base, index = split_index(h)  # expert e of a fused (E, ...) tensor: slice e
                path = files[base]
                start, header = headers[path]
                meta = _sliced(dict(header[base]), index)
                shape = tuple(meta["shape"])[:: -1 if transposed else 1]
                rows = shape[0] if shape else 1
                if offset + rows > dst.shape[0] or shape[1:] != tuple(dst.shape[1:]):
                    raise CheckpointError(
                        f"tensor {h}: shape {tuple(meta['shape'])} does not fit {ours}"
                        f" {tuple(dst.shape)} at row {offset}"
                    )
                if path not in opened:
                    opened[path] = handles.enter_context(open(path, "rb"))
                part = dst[offset : offset + rows]
                _read_into(part, opened[path], start, meta, transposed, f"{h} in {path}")
                offset += rows
            if offset != dst.shape[0]:
                raise CheckpointError(
                    f"{ours} <- {', '.join(hf_names)}: {offset} rows filled, expected"
                    f" {dst.shape[0]}"
                )


def save_hf_folder(
    model: TransformerModel,
    directory: str | os.PathLike[str],
    family: str,
    *,
    tokenizer: BPETokenizer | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint folder of ``family`` (a ``model_type`` of
    aiayn/interop/families.py: "gpt2", "llama", "mistral", "qwen2", "mixtral", "bert",
    "marian", "bart"), atomically; shards of at most ``max_shard_bytes`` with an index, and
    the tokenizer as ``tokenizer.json`` when given."""
    hf_config, names = family_of(family).write(model.config)
    tensors = _hf_tensors(model, names)
    stored = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    major = int(import_transformers().__version__.split(".")[0])
    setattr(hf_config, "dtype" if major >= 5 else "torch_dtype", stored)  # renamed in 5.0

    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text(hf_config.to_json_string())
        if tokenizer is not None:
            tokenizer.tok.save(str(tmp / "tokenizer.json"))
        _write_shards(tmp, tensors, max_shard_bytes)

    return write_atomically(Path(directory), fill)


def _hf_tensors(model: TransformerModel, names: NameMap) -> dict[str, torch.Tensor]:
    """``model``'s parameters under their HF names, in HF's layout: fused projections split
    again, slices of one HF tensor stacked (a fused Mixtral's experts; BART's offset position
    table, whose rows before the offset are zeros)."""
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
    return tensors


def _write_shards(folder: Path, tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> None:
    """``tensors`` as model.safetensors or, over ``max_shard_bytes``, as numbered shards with
    the index HF's ``from_pretrained`` reads."""
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
        save_file(shards[0], str(folder / SINGLE), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (folder / INDEX).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )


def _split_sizes(model: TransformerModel, ours: str, parts: int) -> list[int]:
    """Rows of each HF tensor in one of ours: q, k, v in the fused projection; gate and up in
    SwiGLU's w13; a plain tensor whole."""
    c = model.config
    rows = dict(model.named_parameters())[ours].shape[0]
    if parts == 1:
        return [rows]
    if ours.endswith(("qkv.weight", "qkv.bias")):
        q, kv = c.attention.n_heads * c.head_dim, c.kv_heads * c.head_dim
        if rows == q + 2 * kv:
            return [q, kv, kv]
    return [rows // parts] * parts
