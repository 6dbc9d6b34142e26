"""Encoder-decoder decoding: beam 1 = greedy, batched beam = one at a time, length penalty."""

from __future__ import annotations

import pytest
import torch

from aiayn.generate.beam import (
    BeamConfig,
    _Beams,
    _Rules,
    _select,
    beam_search,
    greedy_decode,
    length_penalty,
)
from aiayn.models import EncoderDecoder
from tests.conftest import tiny_model

BOS, EOS = 1, 2


def small(**kw: object) -> EncoderDecoder:
    model = tiny_model("paper-base", **{"vocab_size": 24, "max_len": 64, "init_std": 0.3, **kw})
    assert isinstance(model, EncoderDecoder)
    return model


def sources() -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 24, (4, 9), generator=g)
    src[1, 5:] = 0  # padding
    src[3, 3:] = 0
    return src


def naive_greedy(model: EncoderDecoder, src: torch.Tensor, limit: int) -> list[int]:
    """Re-run the decoder over the whole prefix at every step (no cache)."""
    out = [BOS]
    while len(out) - 1 < limit:
        nxt = int(model(src, torch.tensor([out]))[0, -1].argmax())
        if nxt == EOS:
            break
        out.append(nxt)
    return out[1:]


def test_greedy_with_cache_equals_naive() -> None:
    model = small()
    src = sources()
    got = greedy_decode(model, src, bos=BOS, eos=EOS, max_extra=6)
    for i in range(4):
        real = src[i : i + 1, : int((src[i] != 0).sum())]
        assert got[i] == naive_greedy(model, real, real.shape[1] + 6)


def test_beam_one_equals_greedy() -> None:
    model = small()
    src = sources()
    greedy = greedy_decode(model, src, bos=BOS, eos=EOS, max_extra=6)
    assert (
        beam_search(model, src, bos=BOS, eos=EOS, config=BeamConfig(beam_size=1, max_extra=6))
        == greedy
    )


@pytest.mark.parametrize(
    ("alpha", "compile"),
    [(0.0, "off"), (0.6, "off"), (2.0, "off"), pytest.param(0.6, "on", marks=pytest.mark.slow)],
)
def test_batched_beam_equals_one_sentence_at_a_time(alpha: float, compile: str) -> None:
    """Eager, and with the captured step (aiayn/generate/captured.py), where finished sentences
    stay in the batch instead of leaving it.  The captured batch is checked against the eager
    sentences: one capture (a batch size is a capture), and the stronger claim."""
    model = small()
    src = sources()
    cfg = BeamConfig(beam_size=4, length_penalty=alpha, max_extra=8)
    batched = beam_search(model, src, bos=BOS, eos=EOS, config=cfg, compile=compile)
    for i in range(4):
        real = src[i : i + 1, : int((src[i] != 0).sum())]  # no padding at all
        one = beam_search(model, real, bos=BOS, eos=EOS, config=cfg)
        assert batched[i] == one[0]
    # More padding than needed changes nothing either.
    wide = torch.cat([src, torch.zeros(4, 5, dtype=torch.long)], 1)
    assert beam_search(model, wide, bos=BOS, eos=EOS, config=cfg, compile=compile) == batched


@torch.no_grad()
def brute_force_best(
    model: EncoderDecoder, src: torch.Tensor, limit: int, alpha: float
) -> list[int]:
    """Exhaustive search over every output up to ``limit`` tokens (tiny vocabularies only)."""
    best: tuple[float, list[int]] = (float("-inf"), [])
    frontier: list[tuple[float, list[int]]] = [(0.0, [])]
    for length in range(1, limit + 1):
        nxt = []
        for score, seq in frontier:
            logp = model(src, torch.tensor([[BOS, *seq]]))[0, -1].log_softmax(-1)
            for t in range(logp.shape[0]):
                s = score + float(logp[t])
                if t == EOS:
                    best = max(best, (s / length_penalty(length, alpha), seq))
                elif length == limit:
                    best = max(best, (s / length_penalty(length, alpha), [*seq, t]))
                else:
                    nxt.append((s, [*seq, t]))
        frontier = nxt
    return best[1]


def test_wide_beam_finds_the_exhaustive_optimum() -> None:
    model = small(vocab_size=6, pad_id=0)
    src = torch.tensor([[3, 4, 5]])
    cfg = BeamConfig(beam_size=60, length_penalty=0.6, max_extra=0 + 1, early_stopping=False)
    limit = 3 + 1
    assert beam_search(model, src, bos=BOS, eos=EOS, config=cfg)[0] == brute_force_best(
        model, src, limit, 0.6
    )


@torch.no_grad()
def python_beam_search(  # noqa: C901, PLR0915 (the textbook loop, as one reads it)
    model: EncoderDecoder,
    src: torch.Tensor,
    *,
    bos: int,
    eos: int,
    config: BeamConfig,
) -> list[list[int]]:
    """The rules of beam search written as a plain Python loop per sentence and candidate (the
    implementation before it moved onto tensors): the reference the fast one must equal."""
    model.eval()
    k = config.beam_size
    memory, keep = model.encode(src)  # (B, S, C), (B, S)
    b, device = src.shape[0], src.device
    limits = [
        min(int(n) + config.max_extra, model.config.max_len - 1)
        for n in (keep.sum(-1).tolist() if keep is not None else [src.shape[1]] * src.shape[0])
    ]
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
        logprobs = logits.float().log_softmax(-1)  # (B·K, V)
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


@pytest.mark.parametrize(
    ("seed", "compile"),
    [
        *((seed, "off") for seed in range(6)),
        *(pytest.param(seed, "on", marks=pytest.mark.slow) for seed in (1, 3)),
    ],
)
def test_tensor_beam_search_equals_the_python_loop(seed: int, compile: str) -> None:
    g = torch.Generator().manual_seed(seed)
    beam = [1, 2, 3, 5][seed % 4]
    alpha = [0.0, 0.6, 1.5][seed % 3]
    cfg = BeamConfig(
        beam_size=beam, length_penalty=alpha, max_extra=1 + seed % 4, early_stopping=seed % 2 == 0
    )
    model = small(vocab_size=[8, 24][seed % 2], init_std=0.5)
    src = torch.randint(3, model.config.vocab_size, (5, 7), generator=g)
    src[1, 4:] = 0
    src[3, 2:] = 0
    assert beam_search(model, src, bos=BOS, eos=EOS, config=cfg, compile=compile) == (
        python_beam_search(model, src, bos=BOS, eos=EOS, config=cfg)
    )


@pytest.mark.slow
def test_a_captured_search_selects_in_one_graph_compiled_once() -> None:
    """A step's selection traces as one graph with no break, and a second captured search of
    other lengths (in the same bucket) compiles neither its selection nor its step again:
    the step number and the length penalty reach the selection as tensors."""
    explained = torch._dynamo.explain(_select)(
        torch.randn(8, 24),
        _Beams.start(torch.tensor([9, 12]), 4, 64),
        torch.tensor(3),
        torch.tensor(1.2),
        _Rules(4, EOS, True, (0,), torch.get_num_threads()),
    )
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    model, src = small(), sources()
    cfg = BeamConfig(max_extra=8)
    shorter = beam_search(model, src[:, :6], bos=BOS, eos=EOS, config=cfg, compile="on")
    with torch.compiler.set_stance("fail_on_recompile"):  # more steps than the first search
        longer = beam_search(model, src, bos=BOS, eos=EOS, config=cfg, compile="on")
    assert max(map(len, longer)) > max(map(len, shorter))


def test_output_length_limit_and_penalty() -> None:
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(10, 0.0) == 1.0
    assert length_penalty(7, 1.0) == pytest.approx(2.0)
    model = small()
    src = sources()
    for out, row in zip(
        beam_search(model, src, bos=BOS, eos=EOS, config=BeamConfig(max_extra=2)), src, strict=True
    ):
        assert len(out) <= int((row != 0).sum()) + 2
    with pytest.raises(ValueError, match="beam_size"):
        BeamConfig(beam_size=0)


def test_special_tokens_are_never_emitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that prefers PAD, BOS and UNK above all else still never outputs them."""
    model = small()
    decode = model.decode

    def favour_specials(*args: object, **kwargs: object) -> torch.Tensor:
        logits = decode(*args, **kwargs)  # type: ignore[arg-type]
        logits[..., [0, 1, 3]] += 100.0
        return logits

    monkeypatch.setattr(model, "decode", favour_specials)
    src = sources()
    never = (0, 1, 3)
    unmasked = greedy_decode(model, src, bos=BOS, eos=EOS, max_extra=4)
    assert any(t in never for hyp in unmasked for t in hyp)  # the bias does bite
    for hyps in (
        greedy_decode(model, src, bos=BOS, eos=EOS, max_extra=4, never=never),
        beam_search(model, src, bos=BOS, eos=EOS, config=BeamConfig(max_extra=4), never=never),
    ):
        assert not any(t in never for hyp in hyps for t in hyp)
