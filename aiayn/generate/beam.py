"""Decoding an encoder-decoder: greedy and batched beam search (§6.1 of the paper).

The paper decodes with "beam search with a beam size of 4 and length penalty α = 0.6 ...
maximum output length ... input length + 50, but terminate early when possible".  The length
penalty is GNMT's (Wu et al., 2016): a finished hypothesis Y is ranked by

    log P(Y | X) / lp(Y),   lp(Y) = ((5 + |Y|) / 6) ^ α

Both decoders run the encoder once, then feed one target token per step through the
decoder's KV cache (cross-attention keys/values are computed on the first step and reused).
Beam search keeps B·K rows in the cache and reorders them by the surviving beams' parents at
every step.  All bookkeeping is on tensors -- candidate selection, finished hypotheses, the
length penalty, the per-sentence length limits -- so a step costs a few tensor operations
whatever the batch, with no Python loop over sentences or candidates (tests/generate/
test_beam.py checks it against a plain Python implementation of the same rules).  A step's
selection (``_select``) is one branch-free function of tensors, so a search whose decoder step
is captured (aiayn/generate/captured.py) compiles its selection too, once for all its steps.  Each sentence's own source length bounds its output, so a sentence decodes to the
same result whatever it is batched with (tests/generate/test_beam.py).

Tokens listed in ``never`` (padding, BOS, unknown: what translation passes) are masked out of
every step's distribution, so they can never appear in an output.

Hypotheses end at EOS (an EOS among the K best candidates of a step finishes one);
``early_stopping`` ends a sentence as soon as it has K finished hypotheses (the usual setting
in fairseq and Hugging Face); a hypothesis still open at the length limit is finished there
without EOS.  The answer is the finished hypothesis with the best length-normalised score
(the first one found, on a tie).

Shapes: B sentences, K beam size, S source length, V vocabulary.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from aiayn.errors import UserError
from aiayn.generate.cancel import CancelToken, check
from aiayn.generate.captured import captured_step, compile_options, wants_capture
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.nn.cache import Cache
from aiayn.nn.cpu_decoding import for_decoding
from aiayn.nn.static_cache import StaticCache, capacity_for


@dataclass(frozen=True)
class BeamConfig:
    beam_size: int = 4
    length_penalty: float = 0.6  # α of GNMT; 0 = rank by raw log-probability
    max_extra: int = 50  # output length limit = source length + max_extra
    early_stopping: bool = True

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise UserError(f"beam_size={self.beam_size} must be >= 1")
        if self.length_penalty < 0:
            raise UserError(f"length_penalty={self.length_penalty} must be >= 0")
        if self.max_extra < 1:
            raise UserError(f"max_extra={self.max_extra} must be >= 1")


PAPER_BEAM = BeamConfig()  # §6.1: beam 4, α = 0.6, input length + 50


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ^ α."""
    return ((5.0 + length) / 6.0) ** alpha


def _mask_(logits: Tensor, never: Sequence[int]) -> Tensor:
    """(N, V) logits with the ``never`` columns set to -inf in place (the rest renormalise
    around them).  The logits are the decoder's fresh output, so writing into them saves a
    copy of N·V floats per step."""
    if never:
        logits[:, list(never)] = float("-inf")
    return logits


def _limits(model: EncoderDecoder, src: Tensor, keep: Tensor | None, max_extra: int) -> Tensor:
    """(B,) output length limit of each sentence: its source length + ``max_extra``, within
    the model's positions (one is taken by BOS)."""
    lengths = keep.sum(-1) if keep is not None else torch.full((src.shape[0],), src.shape[1])
    return (lengths.to(src.device) + max_extra).clamp(max=model.config.max_len - 1)


def _as_lists(tokens: Tensor, lengths: Tensor) -> list[list[int]]:
    return [row[:n] for row, n in zip(tokens.tolist(), lengths.tolist(), strict=True)]


@torch.no_grad()
def greedy_decode(
    model: EncoderDecoder,
    src: Tensor,
    *,
    bos: int,
    eos: int,
    max_extra: int = 50,
    never: Sequence[int] = (),
    cancel: CancelToken | None = None,
) -> list[list[int]]:
    """Most likely next token at every step; output ids exclude BOS and EOS.  ``cancel``
    stops the loop at its next step (aiayn/generate/cancel.py)."""
    model.eval()
    with for_decoding(model, src.shape[0]):
        return _greedy(model, src, bos, eos, max_extra, never, cancel)


def _greedy(
    model: EncoderDecoder,
    src: Tensor,
    bos: int,
    eos: int,
    max_extra: int,
    never: Sequence[int],
    cancel: CancelToken | None,
) -> list[list[int]]:
    memory, keep = model.encode(src)
    b, device = src.shape[0], src.device
    limits = _limits(model, src, keep, max_extra)  # (B,)
    steps = int(limits.max())
    cache = model.new_cache(b, steps + 1)
    token = torch.full((b, 1), bos, dtype=torch.long, device=device)
    out = torch.zeros(b, steps, dtype=torch.long, device=device)
    length = torch.zeros(b, dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    for step in range(steps):
        check(cancel)
        logits = model.decode(token, memory if step == 0 else None, keep, cache=cache)[:, -1]
        token = _mask_(logits, never).argmax(-1, keepdim=True)  # (B, 1)
        ends = token[:, 0] == eos
        grows = ~done & ~ends
        out[:, step] = token[:, 0]
        length += grows.long()
        done |= ends | (length >= limits)
        if bool(done.all()):
            break
    return _as_lists(out, length)


@torch.no_grad()
def beam_search(
    model: EncoderDecoder,
    src: Tensor,
    *,
    bos: int,
    eos: int,
    config: BeamConfig = PAPER_BEAM,
    never: Sequence[int] = (),
    cancel: CancelToken | None = None,
    compile: str = "off",
) -> list[list[int]]:
    """The best hypothesis per sentence (ids without BOS/EOS), by length-normalised score.
    ``cancel`` stops the search at its next step (aiayn/generate/cancel.py).  ``compile``
    ("auto", "on", "off") captures the decoder's one-token step (aiayn/generate/captured.py)."""
    model.eval()
    # One weight layout for the whole search: K·B rows per step is a small matrix product,
    # faster from a packed weight (aiayn/nn/cpu_kernels.py).
    with for_decoding(model, src.shape[0] * config.beam_size):
        rows, steps = src.shape[0] * config.beam_size, search_steps(model, src.shape[1], config)
        decode = _Steps(model, wants_capture(model, compile, rows, steps))
        return _beam_search(model, src, bos, eos, config, never, cancel, decode)


def search_steps(model: EncoderDecoder, source_len: int, config: BeamConfig) -> int:
    """The most steps a search of sources padded to ``source_len`` makes (``_limits``)."""
    return min(source_len + config.max_extra, model.config.max_len - 1)


SOURCE_MULTIPLE = 32  # a captured search pads its source's keys to a multiple of this


class _Steps:
    """The decoder's steps of one search: eager over a growing cache, or -- ``captured`` --
    the first step eager into a static cache (it computes the cross-attention keys and
    values) and every later one the captured step.  A captured search keeps its rows: a
    finished sentence stays in the batch with no live beam (a new row count would be a new
    capture), where an eager one leaves it."""

    def __init__(self, model: EncoderDecoder, captured: bool) -> None:
        self.model, self.captured = model, captured

    def new_cache(self, rows: int, steps: int) -> Cache | StaticCache:
        if not self.captured:
            return self.model.new_cache(rows, steps + 1)
        return self.model.new_static_cache(rows, self.width(steps))

    def width(self, steps: int) -> int:
        """Slots for ``steps`` outputs: as many, or -- captured -- the static cache's bucket,
        so that searches of nearby lengths share one compiled selection too."""
        if not self.captured:
            return steps
        return capacity_for(steps + 1, self.model.config.max_len)

    def __call__(
        self, tokens: Tensor, memory: Tensor, keep: Tensor | None, first: bool, cache: Any
    ) -> Tensor:
        """(R, 1) tokens -> (R, V) logits.  Only the ``first`` step reads the memory and its
        mask; later ones take the cross-attention keys and values from the cache."""
        if not self.captured:
            return self.model.decode(
                tokens, memory if first else None, keep if first else None, cache=cache
            )[:, -1]
        if not first:
            return captured_step(self.model)(tokens, cache)
        if keep is None:  # a mask to pad: the captured step then serves nearby lengths too
            keep = torch.ones(memory.shape[:2], dtype=torch.bool, device=memory.device)
        cache.reserve(1)
        logits = self.model.decode(tokens, memory, keep, cache=cache)[:, -1]
        cache.pad_memory(SOURCE_MULTIPLE)
        return logits


@dataclass(frozen=True)
class _Rules:
    """What a search's every step selects by; constants of a captured selection."""

    beam_size: int
    eos: int
    early_stopping: bool
    never: tuple[int, ...]
    # Unused by the rules, but guarded: inductor builds its CPU loops for the thread count it
    # compiles under, so each count gets its own compiled selection (as the step does).
    threads: int


class _Beams(NamedTuple):
    """The tensors a step of the search rewrites, one row per alive sentence: A sentences, K
    beams, W >= the longest output."""

    scores: Tensor  # (A, K) cumulative log-probabilities of the live hypotheses
    history: Tensor  # (A, K, W) their tokens
    n_finished: Tensor  # (A,) hypotheses finished so far
    best: Tensor  # (A,) the best finished hypothesis's normalised score
    best_tokens: Tensor  # (A, W) its tokens
    best_len: Tensor  # (A,) its length
    limits: Tensor  # (A,) output length limits

    @classmethod
    def start(cls, limits: Tensor, k: int, width: int) -> _Beams:
        b, device, neg = limits.shape[0], limits.device, float("-inf")
        scores = torch.full((b, k), neg, device=device)
        scores[:, 0] = 0.0  # all beams start identical: expand only the first
        return cls(
            scores,
            torch.zeros(b, k, width, dtype=torch.long, device=device),
            torch.zeros(b, dtype=torch.long, device=device),
            torch.full((b,), neg, device=device),
            torch.zeros(b, width, dtype=torch.long, device=device),
            torch.zeros(b, dtype=torch.long, device=device),
            limits,
        )

    def keep(self, stay: Tensor) -> _Beams:
        """The sentences ``stay`` (their (A',) indices, or an (A,) mask) only."""
        return _Beams(*(t[stay] for t in self))


def _offer(beams: _Beams, candidate: Tensor, tokens: Tensor, length: Tensor) -> _Beams:
    """Each sentence's ``candidate`` (A,) normalised score, with its (A, W) ``tokens`` and
    ``length``, becomes its best where strictly better (so the first of equal scores stays)."""
    better = candidate > beams.best  # (A,)
    return beams._replace(
        best=torch.where(better, candidate, beams.best),
        best_tokens=torch.where(better[:, None], tokens, beams.best_tokens),
        best_len=torch.where(better, length, beams.best_len),
    )


def _select(
    logits: Tensor, beams: _Beams, step: Tensor, lp: Tensor, rules: _Rules
) -> tuple[Tensor, Tensor, _Beams, Tensor]:
    """One step's selection: (A·K, V) logits -> the (A, K) tokens that go on, their parents
    among the K rows of their sentence, the search's new tensors and which sentences are done
    (A,).  Each sentence expands its K live hypotheses, offers the EOS-ended and the
    length-capped ones as finished and keeps the K best that go on.  Branch-free and over
    tensors only (``step`` and the length penalty ``lp`` included), so that a captured search
    compiles it once for all its steps."""
    k, neg = rules.beam_size, float("-inf")
    a = beams.scores.shape[0]
    logprobs = _mask_(logits.float(), rules.never).log_softmax(-1)  # (A·K, V)
    v = logprobs.shape[-1]
    # in place: the log-probabilities are a fresh tensor, and B·K·V floats is megabytes
    cand = logprobs.view(a, k, v).add_(beams.scores[:, :, None]).view(a, k * v)  # (A, K·V)
    top, top_idx = cand.topk(2 * k, dim=-1)  # (A, 2K): room for K that go on
    parent, token = top_idx // v, top_idx % v
    rank = torch.arange(2 * k, device=logits.device)  # (2K,)
    rows = torch.arange(a, device=logits.device)
    live = top > neg  # (A, 2K) real candidates
    is_eos = token == rules.eos
    # An EOS among the best K candidates finishes a hypothesis (the prefix, without EOS).
    finishes = live & is_eos & (rank < k)
    n_finished = beams.n_finished + finishes.sum(-1)
    eos_score = torch.where(finishes, top / lp, neg)
    first = eos_score.argmax(-1)  # (A,) the first best of this step's finished
    prefix = beams.history[rows, parent[rows, first]]  # (A, W)
    beams = _offer(beams._replace(n_finished=n_finished), eos_score[rows, first], prefix, step)
    # The K best candidates that are not EOS go on, in rank order.
    order = torch.where(is_eos, rank + 2 * k, rank).argsort(-1)[:, :k]  # (A, K)
    next_parent, next_token = parent.gather(1, order), token.gather(1, order)
    go_on = live.gather(1, order) & ~is_eos.gather(1, order)  # (A, K)
    next_scores = torch.where(go_on, top.gather(1, order), neg)
    next_token = torch.where(go_on, next_token, rules.eos)
    history = beams.history[rows[:, None], next_parent]  # (A, K, W): the parents' prefixes
    history.index_copy_(2, step.view(1), next_token[:, :, None])
    # The length limit: open hypotheses finish as they are.
    at_limit = beams.limits == step + 1  # (A,)
    limit_score = torch.where(go_on & at_limit[:, None], next_scores / lp, neg)
    first = limit_score.argmax(-1)
    beams = _offer(beams, limit_score[rows, first], history[rows, first], step + 1)
    done = at_limit | ~go_on.any(-1)
    if rules.early_stopping:
        done = done | (n_finished >= k)
    # A done sentence keeps no live hypothesis (a captured search keeps its rows).
    next_scores = next_scores.masked_fill(done[:, None], neg)
    beams = beams._replace(scores=next_scores, history=history)
    return next_token, next_parent, beams, done


@functools.cache
def _captured_select(device: str) -> Any:
    """``_select`` compiled once per process and device (a captured search's selection)."""
    return torch.compile(_select, fullgraph=True, dynamic=False, options=compile_options(device))


def _beam_search(
    model: EncoderDecoder,
    src: Tensor,
    bos: int,
    eos: int,
    config: BeamConfig,
    never: Sequence[int],
    cancel: CancelToken | None,
    decode: _Steps,
) -> list[list[int]]:
    """The search: each step decodes, selects (``_select``) and reorders the cache by the
    surviving hypotheses' parents.  Sentences that are done leave the batch and the cache in
    an eager search, so the last long sentence does not carry the rows of the short ones
    that ended long ago; a captured one keeps them (its shapes stay)."""
    k = config.beam_size
    memory, keep = model.encode(src)  # (B, S, C), (B, S)
    b, device = src.shape[0], src.device
    limits = _limits(model, src, keep, config.max_extra)  # (B,)
    steps = int(limits.max())
    # The K beams of a sentence share its memory: the decoder takes one memory row per
    # sentence for K query rows (aiayn/nn/multihead.py folds them), so the encoder's keys and
    # values are computed, cached and read once per sentence.
    cache = decode.new_cache(b * k, steps)
    beams = _Beams.start(limits, k, decode.width(steps))
    rules = _Rules(k, eos, config.early_stopping, tuple(never), torch.get_num_threads())
    select = _captured_select(device.type) if decode.captured else _select
    tokens = torch.full((b * k, 1), bos, dtype=torch.long, device=device)  # (A·K, 1)
    alive = torch.arange(b, device=device)  # (A,) the sentences still searching
    found: list[list[int]] = [[] for _ in range(b)]
    for step in range(steps):
        check(cancel)
        logits = decode(tokens, memory, keep, step == 0, cache)  # (A·K, V)
        # fp32: on a CPU, eager PyTorch divides an fp32 tensor by a Python number in fp32
        lp = torch.tensor(length_penalty(step + 1, config.length_penalty), device=device)
        at = torch.tensor(step, device=device)
        next_token, parent, beams, done = select(logits, beams, at, lp, rules)
        if bool(done.all()):
            break
        rows = torch.arange(alive.shape[0], device=device)
        if not decode.captured and bool(done.any()):  # those sentences leave the batch
            _record(found, alive[done], beams.keep(done))
            stay = (~done).nonzero().squeeze(1)  # (A',) positions among the alive
            alive, beams, parent, next_token = (
                alive[stay],
                beams.keep(stay),
                parent[stay],
                next_token[stay],
            )
            cache.reorder((stay[:, None] * k + parent).view(-1), memory_index=stay)
        else:
            cache.reorder((rows[:, None] * k + parent).view(-1))
        tokens = next_token.view(-1, 1)
    _record(found, alive, beams)
    return found


def _record(found: list[list[int]], sentences: Tensor, beams: _Beams) -> None:
    """Write the best hypotheses of ``sentences`` (A,) into ``found``."""
    for i, tokens in zip(
        sentences.tolist(), _as_lists(beams.best_tokens, beams.best_len), strict=True
    ):
        found[i] = tokens
