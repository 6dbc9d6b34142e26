"""ALiBi (Press et al., 2022): the paper's slopes, the bias by distance, and a model that uses
it with no position vectors at all."""

from __future__ import annotations

import math

import pytest
import torch

import aiayn
from aiayn.config import AttentionConfig, ModelConfig, PositionConfig
from aiayn.nn.attention import scaled_dot_product_attention
from aiayn.nn.positions import build_positions
from aiayn.nn.positions.alibi import alibi_slopes


def alibi_config(n_heads: int, d_model: int = 512) -> ModelConfig:
    return ModelConfig(
        arch="decoder",
        d_model=d_model,
        attention=AttentionConfig(n_heads=n_heads),
        positions=PositionConfig(scheme="alibi"),
    )


def test_slopes_are_the_papers() -> None:
    # "For 8 heads: 1/2, 1/4, ..., 1/256"; for 6, the 4 of 2^-2k then 2^-1 and 2^-3.
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-k for k in range(1, 9)]))
    expected6 = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected6))


def test_bias_is_minus_slope_times_distance() -> None:
    scheme = build_positions(alibi_config(n_heads=4))
    pos = torch.arange(5)
    bias = scheme.state(pos, pos).score_bias()
    assert bias is not None and bias.shape == (1, 4, 5, 5)
    m = alibi_slopes(4)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert bias[0, h, i, j].item() == pytest.approx(-m[h].item() * abs(i - j))
    assert scheme.embed(pos) is None  # nothing is added to the embeddings


def test_attention_with_the_bias_by_hand() -> None:
    """One head, zero queries: the scores are the bias alone, so the causal weights of query i
    are exp(-m (i - j)) normalised over j <= i."""
    m = alibi_slopes(1)[0].item()  # 2^-8
    scheme = build_positions(alibi_config(n_heads=1, d_model=8))
    pos = torch.arange(4)
    bias = scheme.state(pos, pos).score_bias()
    q = torch.zeros(1, 1, 4, 8)
    k, v = torch.randn(1, 1, 4, 8), torch.eye(4, 8)[None, None]
    _, w = scaled_dot_product_attention(q, k, v, bias, is_causal=True, return_weights=True)  # type: ignore[misc]
    i = 3
    raw = [math.exp(-m * (i - j)) for j in range(4)]
    expected = [r / sum(raw) for r in raw]
    # fp32 softmax of 4 scores vs fp64: a few ulps (~3e-8 at 0.25); 1e-6 is ~30 of them.
    torch.testing.assert_close(w[0, 0, i], torch.tensor(expected), atol=1e-6, rtol=1e-6)


def test_model_has_no_position_parameters_and_runs_past_its_training_length() -> None:
    torch.manual_seed(0)
    kw = {
        "n_layers": 2,
        "d_model": 32,
        "attention.n_heads": 4,
        "ffn.d_ff": 64,
        "vocab_size": 40,
        "dropout": 0.0,
    }
    alibi = aiayn.build_model("gpt2-small", positions={"scheme": "alibi"}, max_len=256, **kw).eval()
    learned = aiayn.build_model("gpt2-small", max_len=256, **kw)
    assert learned.num_parameters() - alibi.num_parameters() == 256 * 32
    ids = torch.randint(0, 40, (1, 200))
    out = alibi(ids)
    assert out.shape == (1, 200, 40) and torch.isfinite(out).all()
    # Only distances matter: the same tokens 30 positions later get the same bias.
    scheme = alibi.embed.positions
    pos = torch.arange(20)
    torch.testing.assert_close(
        scheme.state(pos + 30, pos + 30).score_bias(), scheme.state(pos, pos).score_bias()
    )


def test_alibi_in_an_encoder_decoder_and_encoder() -> None:
    torch.manual_seed(0)
    kw = {
        "n_layers": 1,
        "d_model": 32,
        "attention.n_heads": 4,
        "ffn.d_ff": 64,
        "vocab_size": 40,
        "dropout": 0.0,
        "max_len": 64,
    }
    mt = aiayn.build_model("paper-base", positions={"scheme": "alibi"}, **kw).eval()
    src, tgt = torch.randint(1, 40, (2, 9)), torch.randint(1, 40, (2, 6))
    full = mt(src, tgt)
    memory, keep = mt.encode(src)
    cache = mt.new_cache(2)
    steps = [
        mt.decode(tgt[:, i : i + 1], memory if i == 0 else None, keep, cache=cache)
        for i in range(6)
    ]
    # fp32, cached steps sum in another order: 32 x 2^-23 ~ 4e-6 per 32-wide sum, over 2 blocks.
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    bert = aiayn.build_model("bert-base", positions={"scheme": "alibi"}, **kw).eval()
    ids = torch.randint(1, 40, (1, 8))
    perm = torch.randperm(8)
    # Without positions an encoder is permutation-equivariant; with ALiBi it is not.
    # fp32 noise here is ~1e-7; the permutation measured 3.4e-4 (logits ~0.3), so 1e-4 sits between.
    assert not torch.allclose(bert(ids[:, perm]), bert(ids)[:, perm], atol=1e-4)


@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_every_backend_applies_the_bias(backend: str) -> None:
    torch.manual_seed(0)
    kw = {
        "n_layers": 2,
        "d_model": 32,
        "attention.n_heads": 4,
        "ffn.d_ff": 64,
        "vocab_size": 40,
        "dropout": 0.0,
        "max_len": 64,
    }
    ref = aiayn.build_model(
        "gpt2-small", positions={"scheme": "alibi"}, attention={"backend": "reference"}, **kw
    )
    torch.manual_seed(0)
    other = aiayn.build_model(
        "gpt2-small", positions={"scheme": "alibi"}, attention={"backend": backend}, **kw
    )
    ids = torch.randint(0, 40, (2, 30))
    # fp32, another kernel's summation order: 32 x 2^-23 ~ 4e-6 per 32-wide sum, over 2 layers.
    torch.testing.assert_close(other.eval()(ids), ref.eval()(ids), atol=1e-5, rtol=1e-5)
