"""Mixture of experts: one expert = dense FFN, routing by hand, balancing loss, capacity."""

from __future__ import annotations

import pytest
import torch

import aiayn
from aiayn.nn.context import Record
from aiayn.nn.feedforward import build_feedforward
from aiayn.nn.moe import MixtureOfExperts, load_balancing_loss


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_one_expert_equals_the_dense_ffn(activation: str) -> None:
    torch.manual_seed(0)
    dense = build_feedforward(16, 32, activation, bias=True)  # type: ignore[arg-type]
    moe = MixtureOfExperts(16, 32, n_experts=1, top_k=1, activation=activation, bias=True)  # type: ignore[arg-type]
    moe.experts[0].load_state_dict(dense.state_dict())
    x = torch.randn(2, 5, 16)
    out, stats = moe(x)
    torch.testing.assert_close(out, dense(x))
    assert stats.dropped == 0 and stats.load.tolist() == [10]
    assert stats.aux_loss.item() == pytest.approx(1.0)


def test_top_k_routing_by_hand() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(8, 16, n_experts=4, top_k=2, activation="gelu", bias=False)
    x = torch.randn(3, 8)[None]
    out, _ = moe(x)
    probs = moe.router(x[0]).softmax(-1)
    for i in range(3):
        w, e = probs[i].topk(2)
        w = w / w.sum()
        expected = sum(w[j] * moe.experts[int(e[j])](x[0, i]) for j in range(2))
        # fp32, the same 8- and 16-term sums in another order: 8 ulps (2^-23) abs, 80 rel.
        torch.testing.assert_close(out[0, i], expected, atol=1e-6, rtol=1e-5)


def test_balancing_loss_is_minimal_for_a_uniform_router() -> None:
    n, e = 64, 8
    uniform = load_balancing_loss(torch.full((n, e), 1 / e), torch.arange(n)[:, None] % e, e)
    assert uniform.item() == pytest.approx(1.0)
    g = torch.Generator().manual_seed(0)
    for scale in (0.5, 2.0, 8.0):
        probs = (scale * torch.randn(n, e, generator=g)).softmax(-1)
        chosen = probs.topk(2, -1).indices
        assert load_balancing_loss(probs, chosen, e).item() > uniform.item()
    collapsed = torch.zeros(n, e)
    collapsed[:, 0] = 1
    assert load_balancing_loss(
        collapsed, torch.zeros(n, 1, dtype=torch.long), e
    ).item() == pytest.approx(e)


def test_capacity_overflow_is_counted_and_not_computed() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(
        8, 16, n_experts=2, top_k=1, activation="relu", bias=True, capacity_factor=0.5
    )
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 10.0  # every token with x0 > 0 prefers expert 0
    x = torch.randn(1, 40, 8)
    x[0, :, 0] = 1.0  # all 40 tokens pick expert 0; capacity = ceil(0.5 * 40 / 2) = 10
    out, stats = moe(x)
    assert stats.load.tolist() == [40, 0] and stats.dropped == 30
    assert out[0, 10:].abs().max() == 0  # overflow: no expert output, the residual carries it
    assert out[0, :10].abs().max() > 0
    unlimited = MixtureOfExperts(8, 16, n_experts=2, top_k=1, activation="relu", bias=True)
    unlimited.load_state_dict(moe.state_dict())
    assert unlimited(x)[1].dropped == 0


@pytest.mark.parametrize(
    ("preset", "kw"),
    [
        ("paper-base", {}),
        ("gpt2-small", {}),
        ("llama-style-small", {"attention.n_kv_heads": 2}),
        ("bert-base", {}),
    ],
)
def test_every_family_takes_experts_and_reports_router_stats(preset: str, kw: dict) -> None:
    torch.manual_seed(0)
    model = aiayn.build_model(
        preset,
        n_layers=2,
        d_model=16,
        attention={"n_heads": 4},
        ffn={"d_ff": 32, "n_experts": 4, "top_k": 2},
        vocab_size=30,
        max_len=16,
        **kw,
    )
    ids = torch.randint(1, 30, (2, 6))
    record = Record()
    logits = model(ids, ids, record=record) if preset == "paper-base" else model(ids, record=record)
    aux = record.router
    layers = 4 if preset == "paper-base" else 2
    assert len(aux) == layers and all(s.load.sum() == 2 * 6 * 2 for s in aux)
    loss = logits.float().logsumexp(-1).mean() + 0.01 * sum(s.aux_loss for s in aux)
    loss.backward()
    router = next(p for n, p in model.named_parameters() if n.endswith("router.weight"))
    assert router.grad is not None and router.grad.abs().sum() > 0
    dense = aiayn.build_model(model.config.replace(ffn={"n_experts": None}))
    assert model.num_parameters() > dense.num_parameters()


def test_bad_moe_configs() -> None:
    with pytest.raises(ValueError, match="FeedForwardConfig.top_k=3"):
        aiayn.get_preset("gpt2-small", ffn={"n_experts": 2, "top_k": 3})
    with pytest.raises(ValueError, match="FeedForwardConfig.capacity_factor=0.0"):
        aiayn.get_preset("gpt2-small", ffn={"n_experts": 2, "capacity_factor": 0.0})
