"""KV caches: growing and rolling (sliding window) layouts, key masks, reorder."""

from __future__ import annotations

import pytest
import torch

import aiayn
from aiayn.generate import SamplingConfig, generate
from aiayn.models import DecoderLM
from aiayn.nn.cache import Cache, KVCache, moved_rows
from aiayn.nn.static_cache import StaticCache


def test_rolling_cache_keeps_only_the_window() -> None:
    cache = KVCache(1, 1, capacity=100, head_dim=1, window=3)
    assert cache.capacity == 3
    for p in range(5):
        k, _ = cache.update(torch.full((1, 1, 1, 1), float(p)), torch.zeros(1, 1, 1, 1))
    assert sorted(k.flatten().tolist()) == [2.0, 3.0, 4.0]  # positions 2..4, in ring order
    # A multi-token step reads the kept positions oldest first, then the new ones.
    k, _ = cache.update(torch.tensor([5.0, 6.0]).view(1, 1, 2, 1), torch.zeros(1, 1, 2, 1))
    assert k.flatten().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert cache.length == 7 and cache.k.shape[2] == 3
    k, _ = cache.update(torch.full((1, 1, 1, 1), 7.0), torch.zeros(1, 1, 1, 1))
    assert sorted(k.flatten().tolist()) == [5.0, 6.0, 7.0]


def test_growing_cache_overflow_is_an_error() -> None:
    cache = KVCache(1, 1, capacity=2, head_dim=1)
    cache.update(torch.zeros(1, 1, 2, 1), torch.zeros(1, 1, 2, 1))
    with pytest.raises(ValueError, match="capacity of 2"):
        cache.update(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))


def window_model(**kw: object) -> DecoderLM:
    torch.manual_seed(0)
    model = aiayn.build_model(
        "llama-style-small",
        **{
            "n_layers": 2,
            "d_model": 32,
            "attention.n_heads": 4,
            "attention.n_kv_heads": 2,
            "ffn.d_ff": 48,
            "vocab_size": 50,
            "max_len": 128,
            "attention.sliding_window": 5,
            "init_std": 0.2,
            **kw,
        },
    )
    assert isinstance(model, DecoderLM)
    return model.eval()


@pytest.mark.parametrize("backend", ["reference", "sdpa", "flash"])
def test_sliding_window_model_agrees_across_backends(backend: str) -> None:
    ref = window_model(**{"attention.backend": "reference"})
    other = window_model(**{"attention.backend": backend})
    ids = torch.randint(0, 50, (2, 23))
    # fp32, another kernel's summation order: 32 x 2^-23 ~ 4e-6 per 32-wide sum, over 2 layers.
    torch.testing.assert_close(other(ids), ref(ids), atol=1e-5, rtol=1e-5)
    # ... and the window matters: a full causal model gives other logits.
    full = window_model(**{"attention.sliding_window": None})
    # 100x the fp32 noise above; the window moves these logits by ~5 (measured).
    assert not torch.allclose(full(ids)[:, 10:], ref(ids)[:, 10:], atol=1e-3)


@pytest.mark.parametrize("positional", ["rope", "alibi"])
@pytest.mark.parametrize("chunks", [[7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [3, 4, 2, 6, 1, 3, 1]])
def test_rolling_cache_equals_uncached_sliding_window(chunks: list[int], positional: str) -> None:
    model = window_model(positions={"scheme": positional})
    ids = torch.randint(0, 50, (2, sum(chunks)))
    full = model(ids)
    cache = model.new_cache(2)
    assert cache.capacity == 5
    parts, start = [], 0
    for n in chunks:
        parts.append(model(ids[:, start : start + n], cache=cache))
        start += n
    # fp32, cached chunks sum in another order: 32 x 2^-23 ~ 4e-6 per 32-wide sum, 2 layers.
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.layers[0].self_kv.k.shape[2] == 5  # memory bounded by the window


@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_rolling_cache_with_left_padding_equals_one_at_a_time(positional: str) -> None:
    model = window_model(positions={"scheme": positional})
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12], [1, 2], [20, 21, 22]]
    greedy = SamplingConfig(temperature=0)
    batched = generate(model, prompts, max_new_tokens=15, sampling=greedy)
    assert batched == [generate(model, [p], max_new_tokens=15, sampling=greedy)[0] for p in prompts]


def test_generation_memory_is_flat_with_a_window() -> None:
    model = window_model()
    cache = model.new_cache(1)
    sizes = set()
    model(torch.randint(0, 50, (1, 4)), cache=cache)
    for _ in range(40):
        model(torch.randint(0, 50, (1, 1)), cache=cache)
        sizes.add(cache.nbytes())
    assert len(sizes) == 1 and cache.length == 44


def test_cache_memory_shrinks_with_grouped_query_heads() -> None:
    def kv_bytes(n_kv: int) -> int:
        m = window_model(**{"attention.sliding_window": None, "attention.n_kv_heads": n_kv})
        c = m.new_cache(1, 64)
        m(torch.randint(0, 50, (1, 10)), cache=c)
        return c.nbytes()

    assert kv_bytes(4) == 2 * kv_bytes(2) == 4 * kv_bytes(1)


def test_reorder_selects_rows() -> None:
    cache = Cache.empty(1, 3, 1, 4, 1)
    cache.layers[0].self_kv.update(torch.arange(3.0).view(3, 1, 1, 1), torch.zeros(3, 1, 1, 1))
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.layers[0].self_kv.k[:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]


REORDERS = {
    "identity": [0, 1, 2, 3, 4, 5],
    "beams": [0, 0, 2, 2, 4, 3],
    "cycle": [1, 2, 0, 3, 5, 4],  # every moving row is also a parent that moves
    "one parent": [3, 3, 3, 3, 3, 3],
    "fewer rows": [5, 4, 0],  # sentences leave the batch
}


def test_moved_rows_names_the_rows_whose_parent_is_another() -> None:
    dest, src = moved_rows(torch.tensor([0, 0, 2, 2, 4, 3]))
    assert dest.tolist() == [1, 3, 5] and src.tolist() == [0, 2, 3]
    dest, src = moved_rows(torch.arange(4))
    assert dest.numel() == src.numel() == 0


@pytest.mark.parametrize(
    ("kind", "name"),
    [("growing", name) for name in REORDERS]
    + [("static", name) for name in REORDERS if name != "fewer rows"],  # keeps its batch
)
def test_reorder_in_place_equals_gathering_every_row(kind: str, name: str) -> None:
    """Rewriting only the rows that change, in place, gives what a fresh gather of every row
    gives, whatever the index: parents that are themselves rewritten, one parent for all,
    fewer rows.  Repeated reorders reuse the buffers."""
    index = torch.tensor(REORDERS[name])
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(6, 2, 5, 3, generator=g)  # 5 of 8 slots filled
    cache: Cache | StaticCache
    if kind == "growing":
        cache = Cache.empty(2, 6, 2, 8, 3)
        for layer in cache.layers:
            layer.self_kv.update(keys, -keys)
    else:
        cache = StaticCache(2, 6, 2, 8, 3)
        cache.reserve(5)
        cache.step_slots = torch.arange(5)
        for layer in cache.layers:
            layer.self_kv.update(keys, -keys)
    buffers = [layer.self_kv.k.data_ptr() for layer in cache.layers]
    expect = keys
    for _ in range(3 if index.shape[0] == 6 else 1):
        cache.reorder(index)
        expect = expect[index]
        for layer in cache.layers:
            kv = layer.self_kv
            assert torch.equal(kv.k[:, :, :5], expect) and torch.equal(kv.v[:, :, :5], -expect)
    assert [layer.self_kv.k.data_ptr() for layer in cache.layers] == buffers


def test_reorder_copies_the_filled_slots_and_keeps_shared_memory_per_sentence() -> None:
    """Rows follow ``index``; cross-attention K/V and the source mask follow it when they have
    one row per batch row, stay when they have one per group (beam search), and keep
    ``memory_index`` when given (finished sentences leave)."""
    g = torch.Generator().manual_seed(0)
    cache = Cache.empty(2, 6, 2, 10, 3)  # 3 sentences x 2 beams, 10 slots
    keys = torch.randn(6, 2, 4, 3, generator=g)
    for layer in cache.layers:
        layer.self_kv.update(keys, -keys)
        layer.cross_kv = (torch.randn(3, 2, 5, 3, generator=g), torch.randn(3, 2, 5, 3))
    cache.memory_mask = torch.rand(3, 5, generator=g) > 0.5
    cross, mask = cache.layers[1].cross_kv, cache.memory_mask
    index = torch.tensor([1, 1, 2, 3, 5, 4])
    cache.reorder(index)
    kv = cache.layers[1].self_kv
    assert kv.capacity == 10 and kv.length == 4
    torch.testing.assert_close(kv.k[:, :, :4], keys[index])
    torch.testing.assert_close(kv.v[:, :, :4], -keys[index])
    kept = cache.layers[1].cross_kv
    assert kept is not None and kept[0] is cross[0] and kept[1] is cross[1]  # shared: as is
    assert cache.memory_mask is mask
    cache.reorder(torch.tensor([4, 5]), memory_index=torch.tensor([2]))  # one sentence left
    torch.testing.assert_close(cache.layers[1].self_kv.k[:, :, :4], keys[index][[4, 5]])
    assert cache.layers[1].cross_kv is not None
    torch.testing.assert_close(cache.layers[1].cross_kv[0], cross[0][[2]])
    assert torch.equal(cache.memory_mask, mask[[2]])
    # One memory row per batch row: it follows the rows.
    per_row = Cache.empty(1, 3, 1, 4, 1)
    per_row.layers[0].cross_kv = (torch.arange(3.0).view(3, 1, 1, 1), torch.zeros(3, 1, 1, 1))
    per_row.reorder(torch.tensor([2, 0, 0]))
    assert per_row.layers[0].cross_kv[0].flatten().tolist() == [2.0, 0.0, 0.0]
