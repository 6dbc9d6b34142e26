"""Encoder-decoder decoding: beam 1 = greedy, batched beam = one at a time, length penalty."""

from __future__ import annotations

import pytest
import torch

import aiayn
from aiayn.generate.beam import BeamConfig, beam_search, greedy_decode, length_penalty
from aiayn.models import EncoderDecoder

BOS, EOS = 1, 2


def small(**kw: object) -> EncoderDecoder:
    torch.manual_seed(0)
    model = aiayn.build_model(
        "paper-base",
        **{"n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "vocab_size": 24, "max_len": 64,
           "dropout": 0.0, "init_std": 0.3, **kw},
    )  # fmt: skip
    assert isinstance(model, EncoderDecoder)
    return model.eval()


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


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_batched_beam_equals_one_sentence_at_a_time(alpha: float) -> None:
    model = small()
    src = sources()
    cfg = BeamConfig(beam_size=4, length_penalty=alpha, max_extra=8)
    batched = beam_search(model, src, bos=BOS, eos=EOS, config=cfg)
    for i in range(4):
        real = src[i : i + 1, : int((src[i] != 0).sum())]  # no padding at all
        assert batched[i] == beam_search(model, real, bos=BOS, eos=EOS, config=cfg)[0]
    # More padding than needed changes nothing either.
    wide = torch.cat([src, torch.zeros(4, 5, dtype=torch.long)], 1)
    assert beam_search(model, wide, bos=BOS, eos=EOS, config=cfg) == batched


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
