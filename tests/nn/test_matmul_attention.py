"""The matmul attention kernel (aiayn/nn/matmul_attention.py) against PyTorch's attention in
fp64, its backward against autograd's numerical gradient, and the backend's choice of it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn.nn.attention import AttentionCall, attend
from aiayn.nn.matmul_attention import MatmulAttention, causal_bias, matmul_attention, max_scores


def _inputs(t: int, s: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(2, 3, t, 8), (2, 3, s, 8), (2, 3, s, 8)]
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for shape in shapes]


def _values_and_grads(fn, q, k, v, d_out):  # type: ignore[no-untyped-def]
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    out.backward(d_out)
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize(("t", "s", "causal"), [(7, 7, True), (5, 9, False), (16, 16, False)])
def test_values_and_gradients_equal_pytorch_attention(t: int, s: int, causal: bool) -> None:
    q, k, v = _inputs(t, s, torch.float32)
    d_out = torch.randn(2, 3, t, 8, generator=torch.Generator().manual_seed(1))
    got = _values_and_grads(
        lambda a, b, c: matmul_attention(a, b, c, is_causal=causal, scale=0.3), q, k, v, d_out
    )
    want = _values_and_grads(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal, scale=0.3),
        q.double(),
        k.double(),
        v.double(),
        d_out.double(),
    )
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        # fp32 vs fp64: 2^-24 ~ 6e-8 per op over 8-term dots and <=16-key sums ~ 1e-6; 10x.
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize("causal", [True, False])
def test_backward_equals_the_numerical_gradient(causal: bool) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    bias = causal_bias(4, torch.float64, q.device)
    assert torch.autograd.gradcheck(
        lambda a, b, c: MatmulAttention.apply(a, b, c, bias if causal else None, 0.5),
        (q.requires_grad_(), k.requires_grad_(), v.requires_grad_()),
        fast_mode=True,
    )


def test_bf16_is_within_bf16_rounding_of_fp64() -> None:
    """Five bf16 matmuls and a softmax summed in fp32: a few bf16 epsilons (2^-8) at most,
    as PyTorch's own bf16 kernel."""
    q, k, v = _inputs(32, 32, torch.bfloat16)
    d_out = torch.randn(2, 3, 32, 8, generator=torch.Generator().manual_seed(1)).bfloat16()
    got = _values_and_grads(
        lambda a, b, c: matmul_attention(a, b, c, is_causal=True, scale=8**-0.5), q, k, v, d_out
    )
    want = _values_and_grads(
        lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
        q.double(),
        k.double(),
        v.double(),
        d_out.double(),
    )
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.bfloat16
        # bf16 keeps 8 bits (2^-8); measured ~1 such epsilon (dk), so 4 leaves room.
        assert ((a.double() - b).norm() / b.norm()).item() < 4 * 2**-8


def test_causal_needs_square_scores() -> None:
    q, k, v = _inputs(3, 5, torch.float32)
    with pytest.raises(ValueError, match="T == S, got 3 and 5"):
        matmul_attention(q, k, v, is_causal=True, scale=1.0)


CAUSAL = AttentionCall(scale=0.3, causal=True)


def _kernel(out: torch.Tensor) -> str:
    return type(out.grad_fn).__name__


def test_the_sdpa_backend_takes_it_only_when_training_on_short_unmasked_inputs() -> None:
    q, k, v = (x.requires_grad_() for x in _inputs(8, 8, torch.float32))
    assert _kernel(attend(q, k, v, CAUSAL)[0]) == "MatmulAttentionBackward"
    with torch.no_grad():  # inference: the fused kernel
        assert attend(q, k, v, CAUSAL)[0].grad_fn is None
    mask = torch.ones(8, 8, dtype=torch.bool)
    assert (
        _kernel(attend(q, k, v, AttentionCall(scale=0.3, mask=mask))[0])
        != "MatmulAttentionBackward"
    )
    dropped = attend(q, k, v, AttentionCall(scale=0.3, causal=True, dropout_p=0.1))[0]
    assert _kernel(dropped) != "MatmulAttentionBackward"
    for dtype in (torch.float32, torch.bfloat16):
        n = int(max_scores(dtype) ** 0.5)
        for length, taken in ((n, True), (n + 1, False)):  # at the limit, one key past it
            q, k, v = (x.requires_grad_() for x in _inputs(length, length, dtype))
            out = attend(q, k, v, CAUSAL)[0]
            assert (_kernel(out) == "MatmulAttentionBackward") is taken, (dtype, length)
