"""Multi-head attention against torch.nn.MultiheadAttention; GQA against repeated heads."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aiayn.nn.cache import Cache
from aiayn.nn.context import Context, Record
from aiayn.nn.masks import causal_mask
from aiayn.nn.multihead import CrossAttention, SelfAttention


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_self_attention_equals_torch(backend: str) -> None:
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    ours = SelfAttention(32, 4, backend=backend).eval()
    ours.load_from_torch(ref)
    x = torch.randn(2, 6, 32)
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, 4:] = False
    expected, ref_w = ref(
        x, x, x, key_padding_mask=~keep, attn_mask=~causal_mask(6), average_attn_weights=False
    )
    mask = keep[:, None, None, :] & causal_mask(6)
    got = ours(x, Context(mask=mask))
    # fp32, torch's summation order: 32 x 2^-23 ~ 4e-6 per 32-wide projection.
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    record = Record(weights=True)
    got2 = ours(x, Context(mask=keep[:, None, None, :], causal=True, record=record))
    torch.testing.assert_close(got2, expected, atol=1e-5, rtol=1e-5)  # as above
    # Weights in [0, 1]: 8 ulps (2^-23) absolute, 80 relative, for a 6-key softmax.
    torch.testing.assert_close(record.attention[0].weights, ref_w, atol=1e-6, rtol=1e-5)


def test_cross_attention_equals_torch() -> None:
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(32, 8, batch_first=True).eval()
    ours = CrossAttention(32, 8).eval()
    ours.load_from_torch(ref)
    x, memory = torch.randn(3, 5, 32), torch.randn(3, 7, 32)
    keep = torch.rand(3, 7) > 0.3
    keep[:, 0] = True
    expected, _ = ref(x, memory, memory, key_padding_mask=~keep)
    got = ours(x, Context(memory=memory, memory_mask=keep[:, None, None, :]))
    # fp32, torch's summation order: 32 x 2^-23 ~ 4e-6 per 32-wide projection.
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="memory"):
        ours(x, Context())


@pytest.mark.parametrize("n_kv", [1, 2])
def test_grouped_query_equals_mha_with_shared_kv_heads(n_kv: int) -> None:
    torch.manual_seed(0)
    h, d, c = 4, 8, 32
    gqa = SelfAttention(c, h, n_kv).eval()
    mha = SelfAttention(c, h, h).eval()
    wq, wk, wv = gqa.qkv.weight.split((h * d, n_kv * d, n_kv * d))
    bq, bk, bv = gqa.qkv.bias.split((h * d, n_kv * d, n_kv * d))

    def rep(w: torch.Tensor) -> torch.Tensor:  # (H_kv*D, ...) -> (H*D, ...): each kv head shared
        return w.unflatten(0, (n_kv, d)).repeat_interleave(h // n_kv, 0).flatten(0, 1)

    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, rep(wk), rep(wv)]))
        mha.qkv.bias.copy_(torch.cat([bq, rep(bk), rep(bv)]))
        mha.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(2, 5, c)
    causal = Context(causal=True)
    torch.testing.assert_close(gqa(x, causal), mha(x, causal))
    assert sum(p.numel() for p in gqa.parameters()) < sum(p.numel() for p in mha.parameters())


def test_gqa_with_all_kv_heads_is_mha() -> None:
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours = SelfAttention(16, 4, n_kv_heads=4).eval()
    ours.load_from_torch(ref)
    x = torch.randn(1, 3, 16)
    # fp32, torch's summation order: 16 x 2^-23 ~ 2e-6 per 16-wide projection.
    torch.testing.assert_close(ours(x, Context()), ref(x, x, x)[0], atol=1e-5, rtol=1e-5)


def test_cache_appends_and_matches_full() -> None:
    torch.manual_seed(0)
    attn = SelfAttention(16, 4, 2).eval()
    x = torch.randn(2, 6, 16)
    full = attn(x, Context(causal=True))
    cache = Cache.empty(1, 2, 2, 8, 4)
    ctx = Context(causal=True, cache=cache)
    first = attn(x[:, :4], ctx)
    steps = [attn(x[:, i : i + 1], ctx) for i in (4, 5)]
    # fp32, cached steps: 16-term sums in another order, 8 ulps (2^-23) abs, 80 relative.
    torch.testing.assert_close(torch.cat([first, *steps], 1), full, atol=1e-6, rtol=1e-5)
    kv = cache.layers[0].self_kv
    assert kv.length == 6 and kv.k.shape == (2, 2, 8, 4)
    with pytest.raises(ValueError, match="capacity of 8"):
        attn(torch.randn(2, 3, 16), ctx)


def test_bad_construction_and_input() -> None:
    with pytest.raises(ValueError, match="multiple of n_heads"):
        SelfAttention(30, 4)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        SelfAttention(32, 4, 3)
    with pytest.raises(ValueError, match=r"\(B, T, d_model\)"):
        SelfAttention(32, 4)(torch.randn(5, 32), Context())
    with pytest.raises(ValueError, match="attention_backend='cuda'"):
        SelfAttention(32, 4, backend="cuda")


@pytest.mark.parametrize("score", ["dot", "additive"])
def test_memory_shared_by_groups_of_rows_equals_repeating_it(score: str) -> None:
    """Beam search gives one memory row per sentence for its K query rows: folding the K rows'
    queries into one row must give what K copies of the memory give, records included."""
    torch.manual_seed(0)
    attn = CrossAttention(32, 4, score=score).eval()
    b, k = 3, 4
    x, memory = torch.randn(b * k, 2, 32), torch.randn(b, 7, 32)
    keep = torch.rand(b, 7) > 0.3
    keep[:, 0] = True

    def run(mem: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, Record]:
        record = Record(weights=True, scores=True)
        ctx = Context(memory=mem, memory_mask=mask[:, None, None, :], record=record)
        return attn(x, ctx), record

    shared, rec_shared = run(memory, keep)
    repeated, rec_repeated = run(memory.repeat_interleave(k, 0), keep.repeat_interleave(k, 0))
    # The same sums in other matmul shapes: ~8 ulps (2^-23 ~ 1.2e-7) of order-1 values.
    torch.testing.assert_close(shared, repeated, atol=1e-6, rtol=1e-6)
    (a,), (r,) = rec_shared.attention, rec_repeated.attention
    assert a.weights is not None and r.weights is not None and a.scores is not None
    assert a.weights.shape == (b * k, 4, 2, 7)
    torch.testing.assert_close(a.weights, r.weights, atol=1e-6, rtol=1e-6)  # as the outputs
    # Scores up to ~2 from 32-wide sums in other shapes: 32 x 2^-23 x 2 ~ 8e-6 worst case.
    torch.testing.assert_close(a.scores, r.scores, atol=1e-5, rtol=1e-5)
    with torch.no_grad(), pytest.raises(ValueError, match="5 rows for 12 query rows"):
        attn(x, Context(memory=torch.randn(5, 7, 32)))
