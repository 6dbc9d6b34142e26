"""Scaled dot-product attention: the worked examples, backends, masks, GQA, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn import scaled_dot_product_attention as sdpa
from aiayn.nn.masks import causal_mask, sliding_window_mask

BACKENDS = ["reference", "sdpa"]
ALL_BACKENDS = [*BACKENDS, "flash"]  # flash registers itself on `import aiayn`


def test_trophy_query_worked_example() -> None:
    # "it" queries trophy, large, suitcase, because.
    q = torch.tensor([[2.0, 1.0, -1.0]])
    k = torch.tensor([[1.8, 0.8, -0.8], [0.2, 0.1, 0.5], [0.3, 0.5, 1.3], [0.0, 0.0, 0.0]])
    raw = q @ k.T
    torch.testing.assert_close(raw, torch.tensor([[5.2, 0.0, -0.2, 0.0]]))
    v = torch.eye(4)  # one-hot values: the output row *is* the weight row
    out, w = sdpa(q, k, v, return_weights=True)
    expected = torch.tensor([[0.874, 0.043, 0.039, 0.043]])
    torch.testing.assert_close(w, expected, atol=5e-4, rtol=0)  # 3 decimals: half the last digit
    torch.testing.assert_close(out[:, :4], w)
    # Scores were divided by sqrt(3) before the softmax.
    torch.testing.assert_close(w, torch.softmax(raw / math.sqrt(3), -1))


def test_two_token_worked_example() -> None:
    q = k = torch.eye(2)
    v = torch.tensor([[10.0, 0.0], [0.0, 20.0]])
    for backend in BACKENDS:
        out = sdpa(q, k, v, backend=backend)
        # Printed to 1 decimal: within half a unit of the last digit.
        torch.testing.assert_close(out, torch.tensor([[6.7, 6.6], [3.3, 13.4]]), atol=0.05, rtol=0)
    _, w = sdpa(q, k, v, return_weights=True)
    a = math.exp(1 / math.sqrt(2))
    torch.testing.assert_close(w[0, 0], torch.tensor(a / (a + 1)))


def test_not_good_under_causal_mask() -> None:
    # Rows: "not", "good".  QK^T = [[0, 1], [1, 0]]; values (negation, polarity).
    q = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    k = torch.eye(2)
    torch.testing.assert_close(q @ k.T, torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
    v = torch.tensor([[-2.0, 0.0], [0.0, 2.0]])
    out, w = sdpa(q, k, v, is_causal=True, return_weights=True)
    torch.testing.assert_close(w[0], torch.tensor([1.0, 0.0]))  # "not" sees only itself
    torch.testing.assert_close(w[1], torch.tensor([0.67, 0.33]), atol=5e-3, rtol=0)  # 2 decimals
    torch.testing.assert_close(out[0], torch.tensor([-2.0, 0.0]))
    # The 2-decimal weights' rounding (5e-3) times the values' size 2.
    torch.testing.assert_close(out[1], torch.tensor([-1.34, 0.66]), atol=2 * 5e-3, rtol=0)
    for backend in BACKENDS:
        torch.testing.assert_close(sdpa(q, k, v, is_causal=True, backend=backend), out)


def test_scale_switch() -> None:
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 6, 8), torch.randn(3, 6, 8)
    for backend in BACKENDS:
        unscaled = sdpa(q, k, v, scale=False, backend=backend)
        manual = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        torch.testing.assert_close(unscaled, manual)
        custom = sdpa(q, k, v, scale=0.5, backend=backend)
        torch.testing.assert_close(custom, torch.softmax(0.5 * q @ k.transpose(-1, -2), -1) @ v)


def _random_masks(b: int, h: int, t: int, s: int) -> list[torch.Tensor | None]:
    g = torch.Generator().manual_seed(1)
    boolean = torch.rand(b, h, t, s, generator=g) > 0.3
    boolean[..., 0] = True
    additive = torch.randn(b, 1, t, s, generator=g)
    key_pad = torch.ones(b, 1, 1, s, dtype=torch.bool)
    key_pad[0, ..., s - 2 :] = False
    return [None, boolean, additive, key_pad]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("mask_kind", range(4))
def test_backends_agree_forward_and_backward(is_causal: bool, mask_kind: int) -> None:
    torch.manual_seed(0)
    b, h, t, s, d = 2, 4, 7, 9 if not is_causal else 7, 16
    mask = _random_masks(b, h, t, s)[mask_kind]
    outs, grads = [], []
    for backend in BACKENDS:
        torch.manual_seed(0)
        q = torch.randn(b, h, t, d, requires_grad=True)
        k = torch.randn(b, h, s, d, requires_grad=True)
        v = torch.randn(b, h, s, d, requires_grad=True)
        out = sdpa(q, k, v, mask, is_causal=is_causal, backend=backend)
        out.square().sum().backward()
        outs.append(out)
        grads.append([x.grad for x in (q, k, v)])
    # fp32, another summation order: D=16 terms x 2^-23 ~ 2e-6 per dot product, ~5x room.
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for g_ref, g_fast in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(g_ref, g_fast, atol=1e-5, rtol=1e-5)  # as the outputs


def test_is_causal_equals_explicit_mask_and_aligns_bottom_right() -> None:
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    mask = causal_mask(3, 5)
    assert mask.tolist() == [
        [True, True, True, False, False],
        [True, True, True, True, False],
        [True, True, True, True, True],
    ]
    for backend in BACKENDS:
        torch.testing.assert_close(
            sdpa(q, k, v, is_causal=True, backend=backend), sdpa(q, k, v, mask, backend="reference")
        )


def test_sliding_window() -> None:
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    mask = sliding_window_mask(6, window=2)
    assert mask.sum(-1).tolist() == [1, 2, 2, 2, 2, 2]
    ref = sdpa(q, k, v, mask, backend="reference")
    for backend in BACKENDS:
        torch.testing.assert_close(sdpa(q, k, v, window=2, backend=backend), ref)
    # A window as long as the sequence is plain causal attention.
    torch.testing.assert_close(sdpa(q, k, v, window=6), sdpa(q, k, v, is_causal=True))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("additive", [False, True])
def test_fully_masked_rows_are_zero_not_nan(backend: str, additive: bool) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 3, 4, 8, requires_grad=True)
    k = torch.randn(2, 3, 5, 8, requires_grad=True)
    v = torch.randn(2, 3, 5, 8, requires_grad=True)
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of batch 0 may attend to nothing
    if additive:
        mask = torch.zeros(2, 1, 4, 5).masked_fill(~mask, float("-inf"))
    out = sdpa(q, k, v, mask, backend=backend)
    assert not out.isnan().any()
    assert out[0, :, 1].abs().max() == 0
    out.sum().backward()
    for x in (q, k, v):
        assert x.grad is not None and not x.grad.isnan().any()
    assert q.grad is not None and q.grad[0, :, 1].abs().max() == 0


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_window_excluding_every_key_gives_zeros(backend: str) -> None:
    # Queries with no key in range: key padding hides the whole window of early queries.
    q, k, v = (torch.randn(1, 2, 6, 8, requires_grad=True) for _ in range(3))
    keep = torch.tensor([[False, False, False, True, True, True]])[:, None, None, :]
    out = sdpa(q, k, v, keep, window=2, backend=backend)
    assert out[:, :, :3].abs().max() == 0 and not out.isnan().any()
    out.sum().backward()
    assert q.grad is not None and not q.grad.isnan().any()
    assert q.grad[:, :, :3].abs().max() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_grouped_query_equals_repeated_heads(backend: str, n_kv: int) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 8)
    k, v = torch.randn(2, n_kv, 5, 8), torch.randn(2, n_kv, 5, 8)
    mask = torch.rand(2, 4, 5, 5) > 0.2
    rep = 4 // n_kv
    expected = sdpa(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), mask, is_causal=True
    )
    torch.testing.assert_close(sdpa(q, k, v, mask, is_causal=True, backend=backend), expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(5,), (5, 5), (2, 1, 5, 5)])
def test_grouped_query_takes_masks_of_any_rank(backend: str, shape: tuple[int, ...]) -> None:
    # A key mask (S,) or (T, S) broadcasts over batch and heads, as in PyTorch; the reference
    # backend once failed on a one-dimensional mask with grouped heads.
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.rand(shape) > 0.3
    mask[..., 0] = True
    expected = sdpa(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), mask)
    torch.testing.assert_close(sdpa(q, k, v, mask, backend=backend), expected)


def test_return_weights_rows_sum_to_one_and_sdpa_refuses() -> None:
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    out, w = sdpa(q, k, v, is_causal=True, return_weights=True)
    torch.testing.assert_close(out, w @ v)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 4))
    assert (w.triu(1) == 0).all()
    with pytest.raises(ValueError, match="reference"):
        sdpa(q, k, v, return_weights=True, backend="sdpa")


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((torch.randn(2, 4, 8), torch.randn(2, 4, 7), torch.randn(2, 4, 7)), {}, "last dim"),
        ((torch.randn(8), torch.randn(8), torch.randn(8)), {}, r"\(\.\.\., T, D\)"),
        ((torch.ones(2, 4, dtype=torch.long),) * 3, {}, "floating-point"),
        ((torch.randn(2, 4, 8), torch.randn(2, 4, 8).double(), torch.randn(2, 4, 8)), {}, "dtype"),
        (
            (torch.randn(1, 3, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)),
            {},
            "multiple",
        ),
        ((torch.randn(2, 4, 8),) * 3, {"mask": torch.ones(3, 4, dtype=torch.bool)}, "broadcast"),
        ((torch.randn(2, 4, 8),) * 3, {"mask": torch.ones(4, 4, dtype=torch.long)}, "mask must be"),
        ((torch.randn(2, 4, 8),) * 3, {"backend": "magic"}, "unknown attention backend"),
        (
            (torch.randn(5, 8), torch.randn(3, 8), torch.randn(3, 8)),
            {"is_causal": True},
            "at least",
        ),
    ],
)
def test_bad_inputs_raise_clear_errors(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sdpa(*args, **kwargs)


def test_row_groups_equal_one_call_over_all_rows() -> None:
    """A decoding step split into ragged groups (each reading only its own keys, with no search
    for fully masked rows) equals the reference over every row and key."""
    from aiayn.nn.attention import AttentionCall, attend

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([7, 3, 12, 12, 5])  # keys each row holds
    q = torch.randn(5, 4, 1, 8, generator=g)  # (B, H, 1, D)
    k, v = torch.randn(2, 5, 4, 12, 8, generator=g)  # (B, H, S, D)
    mask = (torch.arange(12)[None] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
    want = sdpa(q, k, v, mask, backend="reference")
    for groups in (((0, 5, 12),), ((0, 1, 7), (1, 2, 3), (2, 5, 12)), ((0, 2, 7), (2, 5, 12))):
        call = AttentionCall(scale=8**-0.5, mask=mask, row_groups=groups)
        got, _ = attend(q, k, v, call, "sdpa")
        # fp32, another order over D=8, S<=12: 8 x 2^-23 ~ 1e-6 absolute; 1e-5 ~ 80 ulps relative.
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        assert call.for_rows(0, 1, 7).live_rows and not call.live_rows


def test_an_eager_fp32_decoding_step_on_a_cpu_writes_eq1_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step of a few queries without gradients, fp32 on a CPU, takes the written-out
    formula (as a captured step does); a prompt, training and bf16 keep the fused kernel."""
    from aiayn.nn import attention

    taken: list[int] = []
    written_out = attention.reference_backend

    def spy(q, k, v, call):  # type: ignore[no-untyped-def]
        taken.append(q.shape[-2])
        return written_out(q, k, v, call)

    monkeypatch.setattr(attention, "reference_backend", spy)
    call = attention.AttentionCall(scale=0.125)

    def run(t: int, dtype: torch.dtype = torch.float32, grad: bool = False) -> None:
        q = torch.randn(2, 4, t, 16, dtype=dtype, requires_grad=grad)
        k, v = torch.randn(2, 4, 40, 16, dtype=dtype), torch.randn(2, 4, 40, 16, dtype=dtype)
        with torch.set_grad_enabled(grad):
            out, _ = attention.sdpa_backend(q, k, v, call)
        ref, _ = written_out(q, k, v, call)
        if dtype == torch.float32:  # either way, Eq. (1)
            torch.testing.assert_close(out, ref)

    with torch.no_grad():
        run(1)
        run(attention.DECODING_QUERIES)
    assert taken == [1, attention.DECODING_QUERIES]
    run(attention.DECODING_QUERIES + 1)
    run(1, grad=True)
    run(1, dtype=torch.bfloat16)
    assert taken == [1, attention.DECODING_QUERIES]
