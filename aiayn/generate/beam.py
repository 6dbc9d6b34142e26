"""Decoding an encoder-decoder: greedy and batched beam search (§6.1 of the paper).

The paper decodes with "beam search with a beam size of 4 and length penalty α = 0.6 ...
maximum output length ... input length + 50, but terminate early when possible".  The length
penalty is GNMT's (Wu et al., 2016): a finished hypothesis Y is ranked by

    log P(Y | X) / lp(Y),   lp(Y) = ((5 + |Y|) / 6) ^ α

Both decoders run the encoder once, then feed one target token per step through the
decoder's KV cache (cross-attention keys/values are computed on the first step and reused).
Beam search keeps B·K rows in the cache and reorders them by the surviving beams' parents at
every step.  Each sentence's own source length bounds its output, so a sentence decodes to the
same result whatever it is batched with (tests/generate/test_beam.py).

Tokens listed in ``never`` (padding, BOS, unknown: what translation passes) are masked out of
every step's distribution, so they can never appear in an output.

Hypotheses end at EOS; ``early_stopping`` ends a sentence as soon as it has K finished
hypotheses (the usual setting in fairseq and Hugging Face); a hypothesis still open at the
length limit is finished there without EOS.

Shapes: B sentences, K beam size, S source length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.models.encoder_decoder import EncoderDecoder


@dataclass(frozen=True)
class BeamConfig:
    beam_size: int = 4
    length_penalty: float = 0.6  # α of GNMT; 0 = rank by raw log-probability
    max_extra: int = 50  # output length limit = source length + max_extra
    early_stopping: bool = True

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size={self.beam_size} must be >= 1")
        if self.length_penalty < 0:
            raise ValueError(f"length_penalty={self.length_penalty} must be >= 0")
        if self.max_extra < 1:
            raise ValueError(f"max_extra={self.max_extra} must be >= 1")


PAPER_BEAM = BeamConfig()  # §6.1: beam 4, α = 0.6, input length + 50


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ^ α."""
    return ((5.0 + length) / 6.0) ** alpha


def _mask(logits: Tensor, never: Sequence[int]) -> Tensor:
    """(N, V) logits with the ``never`` columns at -inf (the rest renormalise around them)."""
    if never:
        logits = logits.clone()
        logits[:, list(never)] = float("-inf")
    return logits


def _limits(model: EncoderDecoder, src: Tensor, keep: Tensor | None, max_extra: int) -> list[int]:
    lengths = keep.sum(-1).tolist() if keep is not None else [src.shape[1]] * src.shape[0]
    cap = model.config.max_len - 1  # room for BOS
    return [min(int(n) + max_extra, cap) for n in lengths]


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
    src: Tensor,
    *,
    bos: int,
    eos: int,
    max_extra: int = 50,
    never: Sequence[int] = (),
) -> list[list[int]]:
    """Most likely next token at every step; output ids exclude BOS and EOS."""
    model.eval()
    memory, keep = model.encode(src)
    b = src.shape[0]
    limits = _limits(model, src, keep, max_extra)
    cache = model.new_cache(b, max(limits) + 1)
    token = torch.full((b, 1), bos, dtype=torch.long, device=src.device)
    out: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    for step in range(max(limits)):
        logits = model.decode(token, memory if step == 0 else None, keep, cache=cache)[:, -1]
        token = _mask(logits, never).argmax(-1, keepdim=True)  # (B, 1)
        for i, t in enumerate(token[:, 0].tolist()):
            if done[i]:
                continue
            if t == eos:
                done[i] = True
            else:
                out[i].append(t)
                done[i] = len(out[i]) >= limits[i]
        if all(done):
            break
    return out


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
    src: Tensor,
    *,
    bos: int,
    eos: int,
    config: BeamConfig = PAPER_BEAM,
    never: Sequence[int] = (),
) -> list[list[int]]:
    """The best hypothesis per sentence (ids without BOS/EOS), by length-normalised score."""
    model.eval()
    k = config.beam_size
    memory, keep = model.encode(src)  # (B, S, C), (B, S)
    b, device = src.shape[0], src.device
    limits = _limits(model, src, keep, config.max_extra)
    memory = memory.repeat_interleave(k, 0)  # (B·K, S, C)
    keep = None if keep is None else keep.repeat_interleave(k, 0)
    cache = model.new_cache(b * k, max(limits) + 1)
    tokens = torch.full((b * k, 1), bos, dtype=torch.long, device=device)  # (B·K, 1)
    history = torch.zeros(b * k, 0, dtype=torch.long, device=device)  # (B·K, t)
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(b)]
    done = [False] * b
    offsets = (torch.arange(b, device=device) * k)[:, None]  # (B, 1)
    for step in range(max(limits)):
        logits = model.decode(tokens, memory if step == 0 else None, keep, cache=cache)[:, -1]
        logprobs = _mask(logits.float(), never).log_softmax(-1)  # (B·K, V)
        v = logprobs.shape[-1]
        cand = (scores[:, :, None] + logprobs.view(b, k, v)).view(b, k * v)  # (B, K·V)
        top_scores, top_idx = cand.topk(2 * k, dim=-1)  # (B, 2K): room for K that go on
        parent, token = top_idx // v, top_idx % v
        length = step + 1
        lp = length_penalty(length, config.length_penalty)
        next_scores = torch.full((b, k), float("-inf"), device=device)
        next_parent = torch.zeros(b, k, dtype=torch.long, device=device)
        next_token = torch.full((b, k), eos, dtype=torch.long, device=device)
        ts, ps, tk = top_scores.tolist(), parent.tolist(), token.tolist()
        for i in range(b):
            if done[i]:
                continue
            kept = 0
            for rank in range(2 * k):
                s, pa, t = ts[i][rank], ps[i][rank], tk[i][rank]
                if s == float("-inf"):
                    break
                if t == eos:
                    if rank < k:  # an EOS among the best K candidates finishes a hypothesis
                        finished[i].append((s / lp, history[i * k + pa].tolist()))
                    continue
                if kept < k:
                    next_scores[i, kept], next_parent[i, kept], next_token[i, kept] = s, pa, t
                    kept += 1
            if length >= limits[i]:  # the length limit: open beams finish as they are
                for j in range(kept):
                    finished[i].append(
                        (
                            float(next_scores[i, j]) / lp,
                            [
                                *history[i * k + int(next_parent[i, j])].tolist(),
                                int(next_token[i, j]),
                            ],
                        )
                    )
                done[i] = True
            elif config.early_stopping and len(finished[i]) >= k:
                done[i] = True
        if all(done):
            break
        flat = (offsets + next_parent).view(-1)  # (B·K,) rows of the surviving parents
        cache.reorder(flat)
        history = torch.cat([history.index_select(0, flat), next_token.view(-1, 1)], 1)
        tokens = next_token.view(-1, 1)
        scores = next_scores
        for i in range(b):  # finished sentences stop competing (their rows idle along)
            if done[i]:
                scores[i] = float("-inf")
                scores[i, 0] = 0.0
    return [max(f, key=lambda h: h[0])[1] if f else [] for f in finished]
