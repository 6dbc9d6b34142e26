"""What an encoder-only model (BERT) gives back: sentence embeddings and masked-token guesses.

* :func:`sentence_embeddings` -- the mean of the last layer's vectors over each text's real
  tokens ([CLS] and [SEP] included), scaled to unit length: sentence-transformers' "mean
  pooling + Normalize", the usual recipe for BERT-family embedding models.  Texts are batched,
  right-padded with the model's pad id and masked.
* :func:`fill_mask` -- the most likely tokens at each [MASK] of a text, with their
  probabilities, as HF's fill-mask pipeline reports them.

Shapes: B batch, T tokens, C = d_model, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aiayn.data.tokenizer import BPETokenizer, Tokenizer
from aiayn.models import EncoderLM

MASK_TOKENS = ("[MASK]", "<mask>")


def _encoded(tokenizer: Tokenizer, text: str, limit: int, truncate: bool, number: int) -> list[int]:
    ids = tokenizer.encode(text)
    if not ids:
        raise ValueError(f"text {number} is empty: it has no tokens")
    if len(ids) > limit:
        if not truncate:
            raise ValueError(
                f"text {number} has {len(ids)} tokens; the model reads at most {limit}"
                " (pass truncate=True / --truncate to keep its beginning)"
            )
        if isinstance(tokenizer, BPETokenizer):  # HF's truncation: special tokens ([SEP]) stay
            from tokenizers import Tokenizer

            cut = Tokenizer.from_str(tokenizer.tok.to_str())
            cut.enable_truncation(limit)
            return list(cut.encode(text).ids)
        ids = ids[:limit]
    return ids


@torch.no_grad()
def sentence_embeddings(
    model: EncoderLM,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    normalize: bool = True,
    truncate: bool = False,
) -> torch.Tensor:
    """(len(texts), C) float32 embeddings, one per text (module docstring)."""
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    c = model.config
    pad = c.pad_id if c.pad_id is not None else 0
    device = model.embed.token.weight.device
    rows = [_encoded(tokenizer, t, c.max_len, truncate, i) for i, t in enumerate(texts, 1)]
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(len(r) for r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long, device=device)
        keep = torch.zeros(len(chunk), width, dtype=torch.bool, device=device)
        for i, r in enumerate(chunk):
            ids[i, : len(r)] = torch.tensor(r, device=device)
            keep[i, : len(r)] = True
        hidden = model.encode(ids, attention_mask=keep).float()  # (B, T, C)
        mean = (hidden * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)  # (B, C)
        out.append(F.normalize(mean, dim=-1) if normalize else mean)
    return torch.cat(out) if out else torch.zeros(0, c.d_model)


@dataclass(frozen=True)
class Guess:
    token: str
    id: int
    score: float  # probability


def mask_id(tokenizer: Tokenizer) -> int:
    """The id of the tokenizer's mask token ([MASK] or <mask>)."""
    if isinstance(tokenizer, BPETokenizer):
        for name in MASK_TOKENS:
            found = tokenizer.tok.token_to_id(name)
            if found is not None:
                return int(found)
    raise ValueError(f"the tokenizer has no mask token (one of {', '.join(MASK_TOKENS)})")


@torch.no_grad()
def fill_mask(
    model: EncoderLM, tokenizer: Tokenizer, text: str, *, top_k: int = 5
) -> list[list[Guess]]:
    """For each mask token in ``text``, the ``top_k`` likeliest tokens (most likely first)."""
    if top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1")
    mask = mask_id(tokenizer)
    ids = _encoded(tokenizer, text, model.config.max_len, False, 1)
    where = [i for i, t in enumerate(ids) if t == mask]
    if not where:
        raise ValueError(
            f"the text has no mask token: write {MASK_TOKENS[0]} where a word is missing"
        )
    device = model.embed.token.weight.device
    logits = model(torch.tensor([ids], device=device))[0, where].float()  # (M, V)
    probs = logits.softmax(-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [
        [
            Guess(tokenizer.decode([int(i)]).strip(), int(i), float(p))
            for p, i in zip(ps, js, strict=True)
        ]
        for ps, js in zip(top.values, top.indices, strict=True)
    ]
