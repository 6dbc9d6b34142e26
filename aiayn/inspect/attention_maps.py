"""Attention maps of a model on a piece of text, as PNGs with the tokens on the axes.

``attention_maps`` runs ``forward_with_weights`` on a trained checkpoint, or on an untrained
preset (a character vocabulary built from the text itself), and draws

* one head (``layer`` and ``head`` given), one layer's heads (``layer``), or every layer;
* for a decoder-only model the masked self-attention, for an encoder the self-attention;
* for an encoder-decoder the encoder self-attention, the decoder's masked self-attention
  over ``target_text`` and the cross-attention alignment between target and source.

Layers and heads count from 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from aiayn.config import ModelConfig, get_preset, presets
from aiayn.data.tokenizer import BPETokenizer, CharTokenizer, MarianTokenizer, Tokenizer
from aiayn.errors import UserError
from aiayn.inspect import figures
from aiayn.models import EncoderDecoder, TransformerModel, build_model

# An untrained preset is built in memory: refuse sizes that would not fit (llama3-70b).
MAX_PRESET_PARAMETERS = 2_000_000_000


def untrained_config(
    preset: str, vocab_size: int, overrides: Mapping[str, Any] | None = None
) -> ModelConfig:
    """A preset's config for an untrained model reading ``vocab_size`` characters: one shared
    vocabulary, and no padding id (else the character with id 0 would be masked)."""
    fields = {"pad_id": None, **dict(overrides or {}), "vocab_size": vocab_size}
    config = get_preset(preset, **fields)
    if config.arch == "encoder-decoder" and config.src_vocab_size is not None:
        config = config.replace(src_vocab_size=vocab_size)
    return config


def encode(
    tokenizer: Tokenizer, text: str, what: str, *, target: bool = False
) -> tuple[list[int], list[str]]:
    """Token ids of ``text`` and a readable label per token; an error if there are none.
    ``target``: the text is an encoder-decoder's target (Marian cuts it with its target
    SentencePiece model)."""
    if target and isinstance(tokenizer, MarianTokenizer):
        ids = tokenizer.encode_target(text)
    else:
        ids = tokenizer.encode(text)
    if not ids:
        raise UserError(f"the {what} is empty after tokenizing: give at least one token")
    return ids, token_labels(tokenizer, text, ids)


Encoded = tuple[list[int], list[str]]


def as_trained(tokenizer: Tokenizer, source: Encoded, target: Encoded) -> tuple[Encoded, Encoded]:
    """Encoder-decoder inputs framed as in training: source + </s>, <s> + target (BPE models;
    a character model has no special tokens).  Marian's source already ends with </s>, and
    its decoder starts from <pad>."""
    if isinstance(tokenizer, MarianTokenizer):
        tgt, tgt_labels = target
        return source, ([tokenizer.pad_id, *tgt], ["<pad>", *tgt_labels])
    if not isinstance(tokenizer, BPETokenizer):
        return source, target
    from aiayn.data.bpe import BOS, EOS

    (src, src_labels), (tgt, tgt_labels) = source, target
    return ([*src, EOS], [*src_labels, "</s>"]), ([BOS, *tgt], ["<s>", *tgt_labels])


def _load(
    checkpoint_or_preset: str | Path, text: str, overrides: Mapping[str, Any] | None
) -> tuple[TransformerModel, Tokenizer]:
    from aiayn.inspect.calc import parameter_count

    name = str(checkpoint_or_preset)
    if Path(name).is_dir():
        if overrides:
            raise UserError("overrides apply to a preset, not to a trained checkpoint")
        from aiayn.checkpoint import load  # aiayn's, a run's, or an HF folder

        bundle = load(name)
        return bundle.model, bundle.tokenizer
    if name not in presets():
        raise UserError(
            f"{name!r} is neither a checkpoint folder nor a preset; presets: {', '.join(presets())}"
        )
    tokenizer = CharTokenizer.from_text(text)
    config = untrained_config(name, tokenizer.vocab_size, overrides)
    if parameter_count(config) > MAX_PRESET_PARAMETERS:
        raise UserError(
            f"preset {name!r} has {parameter_count(config):,} parameters, too many to build"
            " here; shrink it with overrides such as n_layers=2 d_model=256"
        )
    torch.manual_seed(0)
    return build_model(config), tokenizer


def token_labels(tokenizer: Tokenizer, text: str, ids: list[int]) -> list[str]:
    """A readable label per token: the characters of the text it covers."""
    if isinstance(tokenizer, CharTokenizer):
        return list(text)
    if isinstance(tokenizer, MarianTokenizer):  # its SentencePiece pieces, specials by name
        return [tokenizer.pieces.get(i, f"<{i}>") for i in ids]
    if isinstance(tokenizer, BPETokenizer):
        enc = tokenizer.tok.encode(text)
        labels = [text[a:b] or t for (a, b), t in zip(enc.offsets, enc.tokens, strict=True)]
        if len(labels) == len(ids):
            return labels
    return [tokenizer.decode([i]) for i in ids]


def _check_index(what: str, value: int | None, n: int, where: str) -> None:
    if value is not None and not 0 <= value < n:
        raise UserError(f"{what} {value} is out of range: the {where} has {n} {what}s (0..{n - 1})")


# (stream name, per-layer weights (1, H, T_rows, T_cols), row labels, column labels)
Stream = tuple[str, list[torch.Tensor], list[str], list[str]]

TITLES = {
    "self": "masked self-attention",
    "encoder": "encoder self-attention",
    "decoder": "decoder masked self-attention",
    "cross": "cross-attention (target rows, source columns)",
}


def attention_maps(
    checkpoint_or_preset: str | Path,
    text: str,
    out_dir: str | Path,
    *,
    layer: int | None = None,
    head: int | None = None,
    target_text: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Path]:
    """Draw the attention of a checkpoint (folder) or an untrained preset (name) on ``text``.

    Returns {"encoder" | "decoder" | "cross" | "self": path} of the PNGs written to ``out_dir``.
    """
    if not text:
        raise UserError("the text is empty: give at least one token")
    if head is not None and layer is None:
        raise UserError(f"head {head} needs a layer too (pass layer=...)")
    target = text if target_text is None else target_text
    model, tokenizer = _load(checkpoint_or_preset, text + target, overrides)
    model.eval()
    streams = [s for s in _streams(model, tokenizer, text, target) if s[1]]
    if not streams:  # an RNN baseline has cross-attention at most
        raise UserError(f"{type(model).__name__} records no attention weights to draw")
    for name, ws, _, _ in streams:
        _check_index("layer", layer, len(ws), f"{name} attention")
        _check_index("head", head, ws[0].shape[1], f"{name} attention")
    return {
        name: _draw(name, ws, rows, cols, Path(out_dir), layer, head)
        for name, ws, rows, cols in streams
    }


def _check_length(what: str, ids: list[int], max_len: int) -> None:
    if len(ids) > max_len:
        raise UserError(
            f"the {what} is {len(ids)} tokens long, longer than the model's max_len={max_len}"
        )


@torch.no_grad()
def _streams(model: TransformerModel, tokenizer: Tokenizer, text: str, target: str) -> list[Stream]:
    """The attention ``model`` records on ``text`` (an encoder-decoder: the encoder's on
    ``text``, the decoder's and the cross-attention on ``target``), one stream per kind."""
    max_len = model.config.max_len
    src, src_labels = encode(tokenizer, text, "text")
    if isinstance(model, EncoderDecoder):
        (src, src_labels), (tgt, tgt_labels) = as_trained(
            tokenizer, (src, src_labels), encode(tokenizer, target, "target text", target=True)
        )
        _check_length("text", src, max_len)
        _check_length("target text", tgt, max_len)
        _, w = model.forward_with_weights(torch.tensor([src]), torch.tensor([tgt]))
        return [
            ("encoder", w["encoder"], src_labels, src_labels),
            ("decoder", w["decoder"], tgt_labels, tgt_labels),
            ("cross", w["cross"], tgt_labels, src_labels),
        ]
    _check_length("text", src, max_len)
    _, ws = model.forward_with_weights(torch.tensor([src]))  # type: ignore[operator]
    name = "encoder" if model.config.arch == "encoder" else "self"
    return [(name, ws, src_labels, src_labels)]


def _draw(
    name: str,
    ws: list[torch.Tensor],
    rows: list[str],
    cols: list[str],
    out: Path,
    layer: int | None,
    head: int | None,
) -> Path:
    """One stream's PNG: one head (``layer`` and ``head``), one layer's heads, or every layer."""
    if layer is not None and head is not None:
        return figures.attention_heatmap(
            ws[layer][0, head],
            rows,
            cols,
            out / f"{name}_layer{layer}_head{head}.png",
            f"{TITLES[name]}, layer {layer}, head {head}",
        )
    if layer is not None:
        return figures.attention_grid(
            ws[layer][0],
            rows,
            cols,
            out / f"{name}_layer{layer}.png",
            f"{TITLES[name]}, layer {layer}",
        )
    return figures.all_layers(
        [w[0] for w in ws], rows, cols, out / f"{name}_all_layers.png", TITLES[name]
    )
