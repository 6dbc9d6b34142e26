"""What an encoder-only model (BERT) gives back: sentence embeddings and masked-token guesses.

* ``sentence_embeddings`` -- the last layer's vectors pooled over each text's real tokens
  ([CLS] and [SEP] included) as the checkpoint's own sentence-transformers recipe says
  (aiayn/interop/sentence_transformers.py); by default their mean, scaled to unit length
  ("mean pooling + Normalize", the usual recipe for BERT-family embedding models).  Texts are
  batched, right-padded with the model's pad id and masked.
* ``fill_mask`` -- the most likely tokens at each [MASK] of a text, with their
  probabilities, as HF's fill-mask pipeline reports them.

Shapes: B batch, T tokens, C = d_model, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from aiayn.data.tokenizer import BPETokenizer, Tokenizer
from aiayn.errors import UserError
from aiayn.generate.cancel import CancelToken, check
from aiayn.interop.sentence_transformers import DEFAULT_POOLING, Pooling
from aiayn.models import EncoderLM

MASK_TOKENS = ("[MASK]", "<mask>")


def _limit(model: EncoderLM, tokenizer: Tokenizer) -> int:
    """The most tokens a text may have: the model's positions, or fewer where the tokenizer's
    folder says so (``model_max_length`` in tokenizer_config.json)."""
    named = getattr(tokenizer, "model_max_length", None)
    return min(model.config.max_len, named or model.config.max_len)


def _encoded(tokenizer: Tokenizer, text: str, limit: int, truncate: bool, number: int) -> list[int]:
    ids = tokenizer.encode(text)
    if not ids:
        raise UserError(f"text {number} is empty: it has no tokens")
    if len(ids) > limit:
        if not truncate:
            raise UserError(
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


def pool(hidden: torch.Tensor, keep: torch.Tensor, modes: Sequence[str]) -> torch.Tensor:
    """(B, len(modes) * C) sentence vectors from (B, T, C) token vectors and the (B, T) mask of
    real tokens, one block per pooling mode (aiayn/interop/sentence_transformers.py)."""
    real = keep[..., None].to(hidden.dtype)  # (B, T, 1)
    count = real.sum(1).clamp(min=1e-9)  # (B, 1)
    total = (hidden * real).sum(1)  # (B, C)
    last = keep.long().cumsum(1).argmax(1)  # (B,) the last real token (right padding)
    position = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype)
    weights = real * position[None, :, None]  # (B, T, 1): later tokens weigh more
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    parts = {
        "cls": lambda: hidden[rows, keep.long().argmax(1)],  # the first real token
        "max": lambda: hidden.masked_fill(~keep[..., None], float("-inf")).amax(1),
        "mean": lambda: total / count,
        "mean_sqrt_len_tokens": lambda: total / count.sqrt(),
        "weightedmean": lambda: (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9),
        "lasttoken": lambda: hidden[rows, last],
    }
    return torch.cat([parts[mode]() for mode in modes], dim=-1)


@torch.no_grad()
def sentence_embeddings(
    model: EncoderLM,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    batch_size: int = 32,
    pooling: Pooling = DEFAULT_POOLING,
    truncate: bool = False,
) -> torch.Tensor:
    """(len(texts), D) float32 embeddings, one per text (module docstring); D = d_model times
    the number of pooling modes.  ``pooling.max_tokens`` (else the model's ``max_len``) is the
    longest text read; a longer one is an error unless ``truncate``."""
    rows = encode_texts(model, tokenizer, texts, pooling=pooling, truncate=truncate)
    return embed_ids(model, rows, batch_size=batch_size, pooling=pooling)


def encode_texts(
    model: EncoderLM,
    tokenizer: Tokenizer,
    texts: Sequence[str],
    *,
    pooling: Pooling = DEFAULT_POOLING,
    truncate: bool = False,
) -> list[list[int]]:
    """The token ids ``sentence_embeddings`` reads for ``texts``: lower-cased if the
    recipe says so, at most ``pooling.max_tokens`` / the tokenizer's ``model_max_length`` /
    the model's ``max_len`` each (longer: an error naming the text, or cut with ``truncate``)."""
    limit = min(_limit(model, tokenizer), pooling.max_tokens or model.config.max_len)
    if pooling.lowercase:
        texts = [t.lower() for t in texts]
    return [_encoded(tokenizer, t, limit, truncate, i) for i, t in enumerate(texts, 1)]


@torch.no_grad()
def embed_ids(
    model: EncoderLM,
    rows: Sequence[Sequence[int]],
    *,
    batch_size: int = 32,
    pooling: Pooling = DEFAULT_POOLING,
    cancel: CancelToken | None = None,
) -> torch.Tensor:
    """(len(rows), D) float32 embeddings of texts already turned into token ids ([CLS] and
    [SEP] included, as the tokenizer gives them), pooled as ``pooling`` says.  ``cancel``
    stops the work before its next batch (aiayn/generate/cancel.py)."""
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size} must be >= 1")
    c = model.config
    pad = c.pad_id if c.pad_id is not None else 0
    device = model.embed.token.weight.device
    limit = min(c.max_len, pooling.max_tokens or c.max_len)
    for number, row in enumerate(rows, 1):
        if not row:
            raise UserError(f"input {number} is empty: it has no tokens")
        if len(row) > limit:
            raise UserError(
                f"input {number} has {len(row)} tokens; the model reads at most {limit}"
            )
        if not all(0 <= i < c.vocab_size for i in row):
            raise UserError(f"input {number} has a token id outside 0 to {c.vocab_size - 1}")
    out = []
    for start in range(0, len(rows), batch_size):
        check(cancel)
        chunk = rows[start : start + batch_size]
        width = max(len(r) for r in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long, device=device)
        keep = torch.zeros(len(chunk), width, dtype=torch.bool, device=device)
        for i, r in enumerate(chunk):
            ids[i, : len(r)] = torch.tensor(list(r), device=device)
            keep[i, : len(r)] = True
        hidden = model.encode(ids, attention_mask=keep).float()  # (B, T, C)
        vectors = pool(hidden, keep, pooling.modes)  # (B, D)
        out.append(F.normalize(vectors, dim=-1) if pooling.normalize else vectors)
    width = c.d_model * len(pooling.modes)
    return torch.cat(out) if out else torch.zeros(0, width)


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
    raise UserError(f"the tokenizer has no mask token (one of {', '.join(MASK_TOKENS)})")


@torch.no_grad()
def fill_mask(
    model: EncoderLM, tokenizer: Tokenizer, text: str, *, top_k: int = 5
) -> list[list[Guess]]:
    """For each mask token in ``text``, the ``top_k`` likeliest tokens (most likely first)."""
    if top_k < 1:
        raise UserError(f"top_k={top_k} must be >= 1")
    mask = mask_id(tokenizer)
    ids = _encoded(tokenizer, text, _limit(model, tokenizer), False, 1)
    where = [i for i, t in enumerate(ids) if t == mask]
    if not where:
        raise UserError(
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
