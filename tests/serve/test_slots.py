"""The slot pool: rows of different lengths decode together exactly as each would alone."""

from __future__ import annotations

import pytest
import torch

import aiayn
from aiayn.models import DecoderLM
from aiayn.serve.slots import SlotPool

SMALL = dict(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=50, max_len=48, dropout=0.0)


def lm(**kw: object) -> DecoderLM:
    torch.manual_seed(0)
    m = aiayn.build_model("gpt2-small", **{**SMALL, **kw})
    assert isinstance(m, DecoderLM)
    return m.eval()


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "sinusoidal"])
@torch.no_grad()
def test_rows_of_different_lengths_decode_as_each_alone(positional: str) -> None:
    m = lm(positional=positional, n_kv_heads=2)
    pool = SlotPool(m, slots=4)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 50, (n,), generator=g) for n in (5, 1, 12)]
    # Prefill each row, the longest in chunks of 5 (one cache object across its chunks).
    for row, p in enumerate(prompts):
        cache = pool.row_cache(row)
        for start in range(0, len(p), 5):
            m(p[None, start : start + 5], cache=cache)
        pool.lengths[row] = len(p)
    nxt = torch.randint(0, 50, (3, 4), generator=g)  # four steps of one token per row
    got = [m(nxt[:, i : i + 1], cache=pool.batch_cache(3))[:, -1] for i in range(4)]
    for row, p in enumerate(prompts):
        alone = m(torch.cat([p, nxt[row]])[None])[0, len(p) :]  # (4, V) one full pass
        torch.testing.assert_close(torch.stack([s[row] for s in got]), alone, atol=1e-5, rtol=1e-5)
    assert pool.lengths.tolist() == [9, 5, 16, 0]


@torch.no_grad()
def test_move_carries_a_row() -> None:
    m = lm()
    pool = SlotPool(m, slots=3)
    p = torch.randint(0, 50, (1, 7))
    m(p, cache=pool.row_cache(2))
    pool.lengths[2] = 7
    pool.move(2, 0)
    step = torch.tensor([[3]])
    torch.testing.assert_close(
        m(step, cache=pool.batch_cache(1))[0, -1], m(torch.cat([p, step], 1))[0, -1]
    )


def test_a_full_row_and_unservable_models_are_refused() -> None:
    m = lm()
    pool = SlotPool(m, slots=1, capacity=4)
    pool.lengths[0] = 4
    with pytest.raises(ValueError, match="full"):
        pool.batch_cache(1)
    with pytest.raises(ValueError, match="sliding_window=4"):
        SlotPool(lm(sliding_window=4), slots=1)
    with pytest.raises(ValueError, match="recurrent state"):
        SlotPool(lm(mixer="linear"), slots=1)
    with pytest.raises(ValueError, match="capacity"):
        SlotPool(m, slots=1, capacity=49)


@torch.no_grad()
def test_rows_of_one_length_take_the_unmasked_path_and_agree() -> None:
    m = lm()
    pool = SlotPool(m, slots=2)
    prompts = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(3))
    for row in range(2):
        m(prompts[row : row + 1], cache=pool.row_cache(row))
    pool.lengths[:] = 6
    cache = pool.batch_cache(2)
    assert cache.even
    step = torch.tensor([[7], [9]])
    torch.testing.assert_close(
        m(step, cache=cache)[:, -1], m(torch.cat([prompts, step], 1))[:, -1], atol=1e-5, rtol=1e-5
    )
