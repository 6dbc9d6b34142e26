"""Autoregressive generation from a decoder-only model, with a preallocated KV cache.

Prompts of different lengths are left-padded into one batch; the model's attention mask hides
the padding and its positions count real tokens only, so each prompt is continued exactly as
it would be alone.  The prompt is run once ("prefill"), then each step feeds one token per
sequence and appends its keys and values to the cache, so a step costs the attention over the
cached tokens plus a fixed amount of work -- never a re-run of the prefix.  A step is the
model's ordinary forward pass on one token per row: the same modules as training, so every
block feature works in generation too.

On a CPU a step is bound by reading the weights.  One row per step goes to BLAS's gemv and
several to oneDNN's packed product (aiayn/nn/cpu_kernels.py); with one row, PyTorch's own small
element-wise operations run on one thread, so that its thread pool and BLAS's do not spin
against each other.

Shapes: B batch, P padded prompt length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack

import torch
from torch import Tensor

from aiayn.errors import UserError
from aiayn.generate.captured import CapturedStep, captured_step, wants_capture
from aiayn.generate.sampling import SamplingConfig, choose_next
from aiayn.models.decoder import DecoderLM
from aiayn.nn.cache import Cache
from aiayn.nn.cpu_decoding import for_decoding
from aiayn.nn.static_cache import StaticCache, capacity_for

DEFAULT_SAMPLING = SamplingConfig()  # plain sampling at temperature 1 (frozen, safe to share)


def _eos_ids(eos_id: int | Sequence[int] | None) -> tuple[int, ...]:
    """``eos_id`` as a tuple of ids (empty: generation never ends early)."""
    if eos_id is None:
        return ()
    eos = (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
    if not all(isinstance(e, int) and e >= 0 for e in eos):
        raise UserError(f"eos_id={eos_id!r} should be a token id or a list of token ids")
    return eos


def _prepare(
    prompts: Sequence[Sequence[int]], max_new_tokens: int, max_len: int, truncate: bool
) -> list[list[int]]:
    if not prompts:
        raise UserError("generate() needs at least one prompt")
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens={max_new_tokens} must be >= 1")
    out = []
    for i, prompt in enumerate(prompts):
        prompt = list(prompt)
        if not prompt:
            raise UserError(f"prompt {i} is empty: give at least one token (e.g. a BOS or newline)")
        if len(prompt) > max_len:
            if not truncate:
                raise UserError(
                    f"prompt {i} has {len(prompt)} tokens; the model's max_len={max_len}"
                    f" allows at most {max_len}"
                    " (pass truncate=True to keep only the last tokens)"
                )
            prompt = prompt[-max_len:]
        out.append(prompt)
    return out


def _left_padded(rows: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """(B, P) ids of ``rows`` padded on the left, and (B, P) True at their real tokens."""
    b, p = len(rows), max(len(r) for r in rows)
    ids = torch.zeros(b, p, dtype=torch.long, device=device)
    real = torch.zeros(b, p, dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        ids[i, p - len(r) :] = torch.tensor(r, device=device)
        real[i, p - len(r) :] = True
    return ids, real


class _Contexts:
    """Each row's context past the model's ``max_len``, as it would be alone:
    ``history[i, starts[i]:end]``.

    A row whose context would pass ``max_len`` keeps its last ``max_len - 1`` tokens, as
    nanoGPT crops its context, and re-reads them (their positions restart at 0); the others
    go on with the cache.  The batch's cache is as long as its longest row, so a re-read
    re-reads every row from its own start: rows that did not slide lose nothing.
    """

    def __init__(self, model: DecoderLM, ids: Tensor, starts: Tensor, max_new_tokens: int) -> None:
        self.model, self.max_len = model, model.config.max_len
        self.history = torch.cat(
            [ids, ids.new_zeros(ids.shape[0], max_new_tokens)], 1
        )  # (B, P + N)
        self.starts = starts  # (B,) where each row's context begins in history
        self.end = ids.shape[1]  # history's filled columns

    def feed(self, nxt: Tensor, cache: Cache) -> tuple[Tensor, Cache]:
        """(B, V) logits after the (B,) tokens ``nxt``, and the cache to go on with."""
        self.history[:, self.end] = nxt
        self.end += 1
        full = self.end - self.starts > self.max_len  # (B,) rows whose context overflows
        if not bool(full.any()):
            return self.model(nxt[:, None], cache=cache)[:, -1], cache
        self.starts = torch.where(full, self.end - self.max_len + 1, self.starts)
        first = int(self.starts.min())
        window = self.history[:, first : self.end]  # (B, W), W <= max_len
        positions = torch.arange(first, self.end, device=window.device)
        real = positions[None, :] >= self.starts[:, None]  # (B, W)
        cache = self.model.new_cache(window.shape[0], self.max_len)
        mask = None if bool(real.all()) else real
        return self.model(window, attention_mask=mask, cache=cache, last_only=True)[:, -1], cache


def _seen(ids: Tensor, real: Tensor, vocab_size: int) -> Tensor:
    """(B, V): which tokens each row's prompt holds, for the repetition penalty."""
    seen = torch.zeros(ids.shape[0], vocab_size, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, ids, real)


def _new_cache(
    model: DecoderLM, b: int, p: int, max_new_tokens: int, captured: bool
) -> Cache | StaticCache:
    """The cache for ``b`` rows of ``p`` prompt tokens and ``max_new_tokens`` more: static
    (its capacity a power-of-two bucket, so that captured steps are shared) when captured."""
    max_len = model.config.max_len
    if not captured:
        return model.new_cache(b, min(p + max_new_tokens, max_len))
    static = model.new_static_cache(b, capacity_for(p + max_new_tokens, max_len))
    static.reserve(p)
    return static


def _step(
    model: DecoderLM,
    nxt: Tensor,
    cache: Cache | StaticCache,
    one_step: CapturedStep | None,
    contexts: _Contexts | None,
) -> tuple[Tensor, Cache | StaticCache]:
    """The (B, V) logits after feeding ``nxt`` (B,), and the cache to go on with: the captured
    step, one eager cached step, or a step of contexts that slide (which may give a new
    cache)."""
    if one_step is not None:
        assert isinstance(cache, StaticCache)
        return one_step(nxt[:, None], cache), cache
    if contexts is None:
        return model(nxt[:, None], cache=cache)[:, -1], cache
    assert isinstance(cache, Cache)
    return contexts.feed(nxt, cache)


@torch.no_grad()
def stream(
    model: DecoderLM,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = DEFAULT_SAMPLING,
    seed: int | None = None,
    eos_id: int | Sequence[int] | None = None,
    truncate: bool = False,
    compile: str = "off",
) -> Iterator[Tensor]:
    """Yield (B,) next tokens, one step at a time.  Stops early once every row has emitted
    ``eos_id`` (or any of several: a chat model's end-of-turn and end-of-text tokens); a row
    that has ended repeats its first ``eos_id``.

    Beyond the model's ``max_len`` the context slides: once a row's context would exceed
    ``max_len``, its oldest tokens are dropped and its last ``max_len - 1`` are re-read (as
    nanoGPT crops its context), so any length can be generated; within ``max_len`` every step
    is a single cached token.  Each row slides when it would alone: in a batch with left
    padding the rows' windows differ, and every row keeps its own.

    ``compile`` ("auto", "on", "off") says whether the one-token step is captured
    (aiayn/generate/captured.py): the prompt then fills a static KV cache and every later step
    is one compiled function.  A generation whose context slides runs eagerly.
    """
    cfg = model.config
    rows = _prepare(prompts, max_new_tokens, cfg.max_len, truncate)
    device = next(model.parameters()).device
    eos = _eos_ids(eos_id)
    stop_ids = torch.tensor(eos, dtype=torch.long, device=device)  # (E,)
    ids, real = _left_padded(rows, device)  # (B, P)
    b, p = ids.shape
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    seen = _seen(ids, real, cfg.vocab_size) if sampling.repetition_penalty != 1.0 else None
    slides = p + max_new_tokens > cfg.max_len  # some row's context may pass max_len
    captured = wants_capture(model, compile, b, max_new_tokens) and not slides
    cache = _new_cache(model, b, p, max_new_tokens, captured)
    one_step = captured_step(model) if captured else None
    was_training = model.training
    model.eval()
    packing = ExitStack()
    threads = torch.get_num_threads()
    try:
        # The CPU kernels chosen once for the whole generation (aiayn/nn/cpu_kernels.py):
        # several rows per step from a packed weight, one row by BLAS's gemv.
        plan = packing.enter_context(for_decoding(model, b))
        mask = None if bool(real.all()) else real
        logits = model(ids, attention_mask=mask, cache=cache, last_only=True)[:, -1]  # (B, V)
        if b == 1 and plan.gemv:
            # The steps' products run in BLAS's own threads (where this host runs one row
            # faster so than by F.linear), captured or not; other dtypes and hosts stay on
            # torch's threads.
            torch.set_num_threads(1)
        contexts = None
        if slides:
            starts = torch.tensor([p - len(r) for r in rows], device=device)  # (B,)
            contexts = _Contexts(model, ids, starts, max_new_tokens)
        finished = torch.zeros(b, dtype=torch.bool, device=device)
        for step in range(max_new_tokens):
            nxt = choose_next(logits, sampling, seen=seen, generator=generator)  # (B,)
            if eos:
                nxt = nxt.masked_fill(finished, eos[0])
                finished |= torch.isin(nxt, stop_ids)
            yield nxt
            if (eos and bool(finished.all())) or step == max_new_tokens - 1:
                break
            if seen is not None:
                seen.scatter_(1, nxt[:, None], True)
            logits, cache = _step(model, nxt, cache, one_step, contexts)  # (B, V)
    finally:
        torch.set_num_threads(threads)
        packing.close()
        model.train(was_training)


def generate(
    model: DecoderLM,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingConfig = DEFAULT_SAMPLING,
    seed: int | None = None,
    eos_id: int | Sequence[int] | None = None,
    stop: Sequence[str] = (),
    decode: Callable[[list[int]], str] | None = None,
    truncate: bool = False,
    on_token: Callable[[Tensor], None] | None = None,
    compile: str = "off",
) -> list[list[int]]:
    """New tokens for each prompt (prompt not included).

    Generation of a sequence ends at ``eos_id`` (kept; any of them, if several) or when its
    decoded text contains one of the ``stop`` strings (the tokens up to and including the one
    completing it are kept; the caller trims the text), or after ``max_new_tokens``.
    """
    if stop and decode is None:
        raise UserError("stop strings need decode= (a function from token ids to text)")
    eos = set(_eos_ids(eos_id))
    out: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    for nxt in stream(
        model,
        prompts,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        seed=seed,
        eos_id=eos_id,
        truncate=truncate,
        compile=compile,
    ):
        if on_token is not None:
            on_token(nxt)
        for i, token in enumerate(nxt.tolist()):
            if done[i]:
                continue
            out[i].append(token)
            if token in eos:
                done[i] = True
            elif stop and decode is not None:
                tail = decode(out[i][-64:])
                done[i] = any(s in tail for s in stop)
        if all(done):
            break
    return out
