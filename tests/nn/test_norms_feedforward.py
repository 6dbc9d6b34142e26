from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from aiayn.nn.feedforward import FeedForward, GatedFeedForward, build_feedforward
from aiayn.nn.norms import build_norm


def test_layernorm_formula() -> None:
    norm = build_norm("layernorm", 8, 1e-5)
    with torch.no_grad():
        norm.weight.uniform_()
        norm.bias.uniform_()
    x = torch.randn(3, 8)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(
        norm(x), (x - mean) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias
    )


def test_rmsnorm_formula() -> None:
    norm = build_norm("rmsnorm", 8, 1e-6)
    with torch.no_grad():
        norm.weight.uniform_()
    x = torch.randn(3, 8)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    assert sum(p.numel() for p in norm.parameters()) == 8  # gain only, no bias


def test_unknown_norm() -> None:
    with pytest.raises(ValueError, match="unknown norm"):
        build_norm("batchnorm", 8, 1e-5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("activation", "fn"),
    [("relu", F.relu), ("gelu", F.gelu), ("gelu_tanh", lambda h: F.gelu(h, approximate="tanh"))],
)
def test_feedforward_eq2(activation: str, fn) -> None:  # type: ignore[no-untyped-def]
    ffn = build_feedforward(8, 32, activation, bias=True)  # type: ignore[arg-type]
    assert isinstance(ffn, FeedForward)
    x = torch.randn(2, 3, 8)
    expected = fn(x @ ffn.w1.weight.T + ffn.w1.bias) @ ffn.w2.weight.T + ffn.w2.bias
    torch.testing.assert_close(ffn(x), expected)


def test_swiglu() -> None:
    ffn = build_feedforward(8, 12, "swiglu", bias=False)
    assert isinstance(ffn, GatedFeedForward)
    w1, w3 = ffn.w13.weight[:12], ffn.w13.weight[12:]
    x = torch.randn(2, 3, 8)
    torch.testing.assert_close(ffn(x), (F.silu(x @ w1.T) * (x @ w3.T)) @ ffn.w2.weight.T)
    assert sum(p.numel() for p in ffn.parameters()) == 3 * 8 * 12
