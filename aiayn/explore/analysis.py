"""What the explorer shows for a real model: attention, the next token, a translation.

Each function takes a loaded model and plain values and returns JSON-ready data.  Attention
views re-weight the layer's recorded scores (``aiayn.inspect.scores``): the temperature and
the causal toggle act on the chosen layer's ``Q K^T / sqrt(d_k)``, they do not re-run the layers
above it.  Recorded scores are cached per (model, text, target), so moving a slider costs a
softmax, not a forward pass.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any

import torch

from aiayn.data.tokenizer import BPETokenizer
from aiayn.errors import RequestError
from aiayn.explore.registry import Loaded
from aiayn.generate.sampling import SamplingConfig, next_token_distribution
from aiayn.inspect.attention_maps import as_trained, encode
from aiayn.inspect.scores import AttentionScores, recorded_scores, reweight, view_mask
from aiayn.models import EncoderDecoder


class TooLong(RequestError):
    """Input longer than the model (or the server) accepts (HTTP 413)."""


class NotApplicable(RequestError):
    """A view the chosen model cannot give, e.g. a translation from a language model (HTTP 422)."""


def _encode(
    loaded: Loaded, text: str, what: str, *, target: bool = False
) -> tuple[list[int], list[str]]:
    if not text.strip():
        raise RequestError(f"the {what} is empty: type at least one character")
    return encode(loaded.tokenizer, text, what, target=target)


def _check_length(loaded: Loaded, ids: list[int], what: str) -> None:
    limit = loaded.model.config.max_len
    if len(ids) > limit:
        raise TooLong(
            f"the {what} is {len(ids)} tokens; model {loaded.entry.name!r} accepts at most {limit}"
        )


class Recorded:
    """Token labels and recorded scores of one (model, text, target)."""

    def __init__(
        self,
        streams: dict[str, list[AttentionScores]],
        labels: dict[str, list[str]],
        target: str | None = None,
    ) -> None:
        self.streams = streams
        self.labels = labels  # "source" / "target" token labels
        self.target = target  # the target text read (an encoder-decoder's), else None


_CACHE: OrderedDict[tuple[str, str, str | None], Recorded] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 16


def _text_model(loaded: Loaded) -> None:
    if loaded.model.config.vision.image_size is not None:
        raise NotApplicable("an image model reads images, not text: use its test images")


def image_view(loaded: Loaded, index: int, *, head: int | None = None) -> dict[str, Any]:
    """One test image of an image model: its pixels, the class probabilities, and where the
    [CLS] token attends over the patches in every layer (aiayn/inspect/image_attention.py)."""
    from aiayn.config.run import DataConfig
    from aiayn.data.images import load_split
    from aiayn.inspect.image_attention import cls_attention
    from aiayn.models.vision import VisionTransformer

    model = loaded.model
    if not isinstance(model, VisionTransformer):
        raise NotApplicable(
            f"{loaded.entry.name} is a text model: the image view needs an image model"
        )
    run = loaded.run or {}
    d = DataConfig(**run.get("data", {}))
    split = load_split(d.images, test_fraction=d.test_fraction, seed=d.seed)
    images, labels = split.test
    if not 0 <= index < len(labels):
        raise NotApplicable(f"image {index} is out of range: the test set has {len(labels)} images")
    image = images[index].to(next(model.parameters()).device)
    maps, predicted = cls_attention(
        model, image.cpu() if image.device.type != "cpu" else image, head
    )
    with torch.no_grad():
        probs = torch.softmax(model(image[None]).float(), -1)[0].cpu()
    return {
        "index": index,
        "images": len(labels),
        "pixels": images[index].mean(0).tolist(),  # (H, W), channels averaged
        "labels": split.labels,
        "true": split.labels[int(labels[index])],
        "predicted": split.labels[predicted],
        "probs": [round(float(p), 4) for p in probs],
        "cls_attention": maps.round(4).tolist(),  # (layers, H/P, W/P)
        "head": head,
    }


def record(loaded: Loaded, text: str, target: str | None = None) -> Recorded:
    """Run the model once on ``text`` (and ``target`` for an encoder-decoder) recording scores.

    An encoder-decoder given no target reads its own translation of ``text`` (beam search,
    as ``translation``): its decoder and cross-attention views then show what the model
    attends to while it translates, never the source sentence read as if it were a target.
    """
    _text_model(loaded)
    target = target if (target or "").strip() else None
    key = (loaded.entry.name, text, target)  # cached by what was asked (a slider's moves)
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    model = loaded.model
    if isinstance(model, EncoderDecoder) and target is None:
        target = translation(loaded, text)["translation"]
        if not target.strip():
            raise NotApplicable(
                "the model translates this text to nothing: type a target sentence to see the"
                " decoder and cross-attention"
            )
    src, src_labels = _encode(loaded, text, "text")
    labels = {"source": src_labels}
    if isinstance(model, EncoderDecoder):
        (src, labels["source"]), (tgt, labels["target"]) = as_trained(
            loaded.tokenizer,
            (src, src_labels),
            _encode(loaded, target or "", "target", target=True),
        )
        _check_length(loaded, src, "text")
        _check_length(loaded, tgt, "target")
        device = next(model.parameters()).device
        recorded = recorded_scores(
            model, torch.tensor([src], device=device), torch.tensor([tgt], device=device)
        )
    else:
        _check_length(loaded, src, "text")
        recorded = recorded_scores(
            model, torch.tensor([src], device=next(model.parameters()).device)
        )
    streams: dict[str, list[AttentionScores]] = {}
    for r in recorded:
        streams.setdefault(r.stream, []).append(r)
    result = Recorded(streams, labels, target if isinstance(model, EncoderDecoder) else None)
    with _CACHE_LOCK:
        _CACHE[key] = result
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return result


def attention_view(
    loaded: Loaded,
    text: str,
    *,
    target: str | None = None,
    stream: str | None = None,
    layer: int = 0,
    head: int | None = None,
    temperature: float = 1.0,
    causal: bool | None = None,
) -> dict[str, Any]:
    """One layer's attention: ``head`` None averages the heads.  ``causal`` None follows the
    model (masked for decoder self-attention, open for encoders, n/a for cross-attention).

    Returns rows/cols token labels and ``weights`` with ``None`` where the mask blanks a cell.
    """
    rec = record(loaded, text, target)
    if stream is None:
        stream = next(iter(rec.streams))
    if stream not in rec.streams:
        raise RequestError(
            f"stream {stream!r} is not in this model; it has {', '.join(rec.streams)}"
        )
    layers = rec.streams[stream]
    if not 0 <= layer < len(layers):
        raise RequestError(
            f"layer {layer} is out of range: {stream} has layers 0..{len(layers) - 1}"
        )
    recorded_layer = layers[layer].scores
    assert recorded_layer is not None
    scores = recorded_layer[0]  # (H, T, S)
    n_heads = scores.shape[0]
    if head is not None and not 0 <= head < n_heads:
        raise RequestError(f"head {head} is out of range: the layer has heads 0..{n_heads - 1}")
    model_causal = layers[layer].causal
    if stream == "cross":
        if causal:
            raise NotApplicable("cross-attention has no causal mask: every target sees the source")
        causal = False
    elif causal is None:
        causal = model_causal
    window = layers[layer].window
    weights = reweight(scores, temperature=temperature, causal=causal, window=window)  # (H, T, S)
    shown = weights.mean(0) if head is None else weights[head]  # (T, S)
    keep = view_mask(shown.shape[0], shown.shape[1], causal, window)
    if keep is None:
        keep = torch.ones_like(shown, dtype=torch.bool)
    grid = [
        [round(w, 5) if k else None for w, k in zip(row, keep_row, strict=True)]
        for row, keep_row in zip(shown.tolist(), keep.tolist(), strict=True)
    ]
    src_labels = rec.labels["source"]
    tgt_labels = rec.labels.get("target", src_labels)
    rows = src_labels if stream in ("self", "encoder") else tgt_labels
    cols = src_labels if stream in ("self", "encoder", "cross") else tgt_labels
    return {
        "stream": stream,
        "streams": list(rec.streams),
        "target": rec.target,  # the target read: the one given, or the model's translation
        "layer": layer,
        "n_layers": len(layers),
        "head": head,
        "n_heads": n_heads,
        "temperature": temperature,
        "causal": causal,
        "model_causal": model_causal,
        "rows": rows,
        "cols": cols,
        "weights": grid,
    }


def next_token(
    loaded: Loaded, text: str, *, temperature: float = 1.0, top: int = 15
) -> dict[str, Any]:
    """The language model's distribution over the token after ``text`` at ``temperature``:
    the ``top`` most likely tokens, their probabilities and the entropy (nats)."""
    if loaded.model.config.arch != "decoder":
        raise NotApplicable(
            f"model {loaded.entry.name!r} is {loaded.model.config.arch}: next-token predictions"
            " come from a decoder-only language model"
        )
    ids, _ = _encode(loaded, text, "text")
    _check_length(loaded, ids, "text")
    with torch.no_grad():
        device = next(loaded.model.parameters()).device
        logits = loaded.model(torch.tensor([ids], device=device))[:, -1]  # (1, V)
    probs = next_token_distribution(logits, SamplingConfig(temperature=temperature))[0]  # (V,)
    entropy = float(-(probs * probs.clamp_min(1e-30).log()).sum())
    p, idx = probs.topk(min(top, probs.numel()))
    return {
        "temperature": temperature,
        "tokens": [loaded.tokenizer.decode([int(i)]) for i in idx],
        "ids": [int(i) for i in idx],
        "probs": [round(float(x), 6) for x in p],
        "entropy": round(entropy, 4),
    }


def translation(loaded: Loaded, text: str, *, beam_size: int = 4) -> dict[str, Any]:
    """Translate ``text`` with beam search (the paper's settings, ``beam_size`` beams)."""
    from aiayn.generate.beam import PAPER_BEAM
    from aiayn.generate.translate import translate

    model, tokenizer = loaded.model, loaded.tokenizer
    if not isinstance(model, EncoderDecoder) or not isinstance(tokenizer, BPETokenizer):
        raise NotApplicable(
            f"model {loaded.entry.name!r} does not translate: pick a trained encoder-decoder"
            " checkpoint"
        )
    ids, _ = _encode(loaded, text, "text")
    _check_length(loaded, [*ids, 0], "text")
    beam = dataclasses.replace(PAPER_BEAM, beam_size=beam_size)
    return {"source": text, "translation": translate(model, tokenizer, [text], beam=beam)[0]}
