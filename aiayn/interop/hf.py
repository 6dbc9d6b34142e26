"""What converting a Hugging Face model's weights takes, whatever its family: the map from
aiayn's parameter names to HF's (``NameMap``), what a folder of one family holds in aiayn's
terms (``Reading``), and the strict copy both ways.

Both directions are strict: every parameter on each side is mapped exactly once (shared,
tied tensors count once; non-parameter buffers such as GPT-2's ``attn.bias`` causal masks or
Llama's ``rotary_emb.inv_freq`` are not weights), and any HF option aiayn cannot express
raises ``CheckpointError`` naming the field.  Each family is a module of its own (gpt2.py,
llama.py, bert.py, marian.py, bart.py), registered once in aiayn/interop/families.py.

``transformers`` is imported lazily: it is a test/benchmark dependency, not a runtime one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import CheckpointError

# (our parameter, HF parameters concatenated along our dim 0, HF stores it transposed)
NameMap = list[tuple[str, tuple[str, ...], bool]]


M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class Reading:
    """What a Hugging Face folder of one family holds, in aiayn's terms (each family's
    ``read`` in aiayn/interop/families.py gives one)."""

    config: ModelConfig
    names: NameMap  # aiayn parameter <- the HF tensors that fill it
    skipped: frozenset[str] = frozenset()  # stored, but no weight of their own (tied copies)


def import_transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # the optional extra: aiayn.extras names it
        raise ModuleNotFoundError(
            "converting this Hugging Face checkpoint needs transformers: pip install 'aiayn[hf]'",
            name="transformers",
        ) from err
    return transformers


def check_fields(owner: str, obj: Any, **allowed: tuple[object, ...]) -> None:
    """Raise CheckpointError naming the first field of the Hugging Face config ``obj`` whose
    value is not in ``allowed``; a field it lacks (an older or newer HF) is the representable
    default, ``allowed``'s first."""
    for name, ok in allowed.items():
        value = getattr(obj, name, ok[0])
        if value not in ok:
            raise CheckpointError(
                f"{owner} {name}={value!r} cannot be converted: expected one of {ok}"
            )


def check_settings(
    owner: str, config: ModelConfig, allowed: Mapping[str, tuple[object, ...]]
) -> None:
    """Raise CheckpointError naming the first setting of ``config`` (by its dotted name, e.g.
    ``positions.scheme``, or a derived size such as ``head_dim``) whose value is not in
    ``allowed``."""
    for name, ok in allowed.items():
        value = config.value(name)
        if value not in ok:
            raise CheckpointError(
                f"{owner} {name}={value!r} cannot be converted: expected one of {ok}"
            )


def weights_and_biases(
    ours: str, hf: str, modules: Sequence[tuple[str, str | tuple[str, ...]]]
) -> NameMap:
    """The weight and the bias of each (our module, its HF module -- or modules, concatenated
    along dim 0) under the prefixes ``ours`` and ``hf``: one block of a biased model."""
    names: NameMap = []
    for mine, theirs in modules:
        parts = (theirs,) if isinstance(theirs, str) else theirs
        for kind in ("weight", "bias"):
            names.append((f"{ours}{mine}.{kind}", tuple(f"{hf}{t}.{kind}" for t in parts), False))
    return names


def _assign(dst: Tensor, src: Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise CheckpointError(
            f"weight {name}: shape {tuple(src.shape)} does not fit {tuple(dst.shape)}"
        )
    dst.copy_(src)


def split_index(name: str) -> tuple[str, int | slice | None]:
    """ "a.b[3]" -> ("a.b", 3): slice 3 (along dim 0) of the HF tensor a.b; "a.b[2:]" ->
    ("a.b", slice(2, None)): its rows from 2 on (BART's offset position table); "a.b" ->
    ("a.b", None)."""
    if name.endswith("]"):
        base, _, index = name[:-1].rpartition("[")
        if index.endswith(":"):
            return base, slice(int(index[:-1]), None)
        return base, int(index)
    return name, None


@torch.no_grad()
def _copy(ours: nn.Module, hf: nn.Module, names: NameMap, *, to_hf: bool, family: str) -> None:
    """Copy every mapped weight (HF -> ours, or ours -> HF if ``to_hf``); strict both sides.
    An HF name may also be a buffer that holds a weight (Marian's ``final_logits_bias``)."""
    mine, stored = dict(ours.named_parameters()), dict(hf.named_parameters())  # tied: once
    buffers = dict(hf.named_buffers())
    theirs: dict[str, Tensor] = {}
    for _, hs, _ in names:
        for h in hs:
            base, index = split_index(h)
            found = stored.get(base, buffers.get(base))
            if found is not None:
                theirs[h] = found if index is None else found[index]
    hf_mapped = {split_index(h)[0] for _, hs, _ in names for h in hs}
    for side, params, mapped in (
        ("aiayn", mine, {o for o, _, _ in names}),
        (family, stored, hf_mapped - (set(buffers) - set(stored))),
    ):
        if set(params) != mapped:
            raise CheckpointError(
                f"{family} conversion: {side} weights left unmapped {sorted(set(params) - mapped)},"
                f" expected but absent {sorted(mapped - set(params))}"
            )
    for o, hs, transposed in names:
        parts = [theirs[h].t() if transposed else theirs[h] for h in hs]  # each in our layout
        if to_hf:
            chunks = mine[o].split([p.shape[0] for p in parts], dim=0)
            for h, chunk in zip(hs, chunks, strict=True):
                _assign(theirs[h], chunk.t() if transposed else chunk, h)
        else:
            _assign(mine[o], torch.cat(parts, dim=0), o)


def copied_from_hf(model: M, hf_model: nn.Module, names: NameMap, family: str) -> M:
    """``model``, freshly built, with ``hf_model``'s weights, device, dtype and mode."""
    _copy(model, hf_model, names, to_hf=False, family=family)
    ref = next(hf_model.parameters())
    return model.to(device=ref.device, dtype=ref.dtype).train(hf_model.training)


def copied_to_hf(model: nn.Module, hf_model: M, names: NameMap, family: str) -> M:
    """``hf_model``, freshly built, with ``model``'s weights, device, dtype and mode."""
    _copy(model, hf_model, names, to_hf=True, family=family)
    ref = next(model.parameters())
    return hf_model.to(device=ref.device, dtype=ref.dtype).train(model.training)


def experts_layout(names: Iterable[str]) -> str:
    """How a Mixtral's experts are stored, from its tensor names: "per-expert" (the Hub's
    checkpoints, transformers 4.x) or "fused" (transformers 5)."""
    return "per-expert" if any(".block_sparse_moe." in n for n in names) else "fused"
