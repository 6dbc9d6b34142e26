"""The slot pool: rows of different lengths decode together exactly as each would alone."""

from __future__ import annotations

import itertools

import pytest
import torch

import aiayn
from aiayn.models import DecoderLM
from aiayn.serve.slots import SlotPool

SMALL = {
    "n_layers": 2,
    "d_model": 32,
    "attention.n_heads": 4,
    "ffn.d_ff": 64,
    "vocab_size": 50,
    "max_len": 48,
    "dropout": 0.0,
}
# fp32 summed in another order: a 64-term dot moves up to 64 x 2^-24 ~ 4e-6; CPU: <= 1.8e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}


def lm(**kw: object) -> DecoderLM:
    torch.manual_seed(0)
    m = aiayn.build_model("gpt2-small", **{**SMALL, **kw})
    assert isinstance(m, DecoderLM)
    return m.eval()


@pytest.mark.parametrize("positional", ["learned", "rope", "alibi", "sinusoidal"])
@torch.no_grad()
def test_rows_of_different_lengths_decode_as_each_alone(positional: str) -> None:
    m = lm(positions={"scheme": positional}, attention={"n_kv_heads": 2})
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
        torch.testing.assert_close(torch.stack([s[row] for s in got]), alone, **TOL)
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
        SlotPool(lm(attention={"sliding_window": 4}), slots=1)
    with pytest.raises(ValueError, match="recurrent state"):
        SlotPool(lm(mixer={"kind": "linear"}), slots=1)
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
        m(step, cache=cache)[:, -1], m(torch.cat([prompts, step], 1))[:, -1], **TOL
    )


def brute_force(keys: list[int], call: int) -> float:
    """The cheapest cost of any split into contiguous groups, by trying every split."""
    n, best = len(keys), float("inf")
    for mask in range(1 << (n - 1)):  # bit i set: a group ends after row i
        cost, start = 0.0, 0
        for i in range(n):
            if i == n - 1 or mask >> i & 1:
                cost += (i + 1 - start) * max(keys[start : i + 1]) + call
                start = i + 1
        best = min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_ragged_groups_are_the_cheapest_split(seed: int) -> None:
    from aiayn.serve.slots import GROUP_CALL_COST, ragged_groups

    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(
        1, 400, (int(torch.randint(2, 11, (1,), generator=g)),), generator=g
    ).tolist()
    groups = ragged_groups(keys) or ((0, len(keys), max(keys)),)
    assert groups[0][0] == 0 and groups[-1][1] == len(keys)
    assert all(b == a2 for (_, b, _), (a2, _, _) in itertools.pairwise(groups))
    assert all(n == max(keys[a:b]) for a, b, n in groups)
    cost = sum((b - a) * n + GROUP_CALL_COST for a, b, n in groups)
    assert cost == brute_force(keys, GROUP_CALL_COST)


@pytest.mark.parametrize("positional", ["learned", "alibi"])
@torch.no_grad()
def test_ragged_rows_read_only_their_own_keys_and_agree(
    positional: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every row its own group (no call cost), each row's attention reads only the
    cache up to its own length, yet every row's logits are those of the row decoded alone."""
    from aiayn.nn import attention
    from aiayn.serve import slots

    monkeypatch.setattr(slots, "GROUP_CALL_COST", 0)
    m = lm(positions={"scheme": positional}, attention={"n_kv_heads": 2})
    pool = SlotPool(m, slots=4)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 50, (n,), generator=g) for n in (30, 2, 17, 9)]
    for row, p in enumerate(prompts):
        m(p[None], cache=pool.row_cache(row))
        pool.lengths[row] = len(p)
    read: list[int] = []
    sdpa = attention.sdpa_backend

    def spy(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: attention.AttentionCall
    ) -> object:
        read.append(k.shape[-2])
        return sdpa(q, k, v, call)

    monkeypatch.setitem(attention.registry.REGISTRY["attention_backend"], "sdpa", spy)
    cache = pool.batch_cache(4)
    assert cache.row_groups == ((0, 1, 31), (1, 2, 3), (2, 3, 18), (3, 4, 10))
    step = torch.tensor([[3], [4], [5], [6]])
    got = m(step, cache=cache)[:, -1]  # (4, V)
    assert read == [31, 3, 18, 10] * 2  # per layer: each row up to its own length
    for row, p in enumerate(prompts):
        alone = m(torch.cat([p, step[row]])[None])[0, -1]
        torch.testing.assert_close(got[row], alone, **TOL)
