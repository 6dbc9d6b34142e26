"""The ablations of Table 3 and seed 003 (model config options), in every family and in cached
decoding: additive scores, no sqrt(d_k) scale, no residual connections, positions, norm
placement and a fixed d_k."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import aiayn
from aiayn.config import ModelConfig
from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM
from aiayn.nn.blocks import Block
from aiayn.nn.context import Context

# fp32 summed in another order: a 64-term dot moves up to 64 x 2^-24 ~ 4e-6; CPU: <= 1.0e-6
TOL = {"atol": 1e-5, "rtol": 1e-5}
SMALL = {
    "n_layers": 2,
    "d_model": 32,
    "attention.n_heads": 4,
    "ffn.d_ff": 64,
    "vocab_size": 50,
    "dropout": 0.0,
    "max_len": 64,
}
ABLATIONS: list[dict[str, object]] = [
    {"attention.score": "additive"},
    {"attention.score": "additive", "attention.n_kv_heads": 2, "positions.scheme": "rope"},
    {"attention.scale": False},
    {"residual": False},
    {"residual": False, "norm_position": "pre"},
    {"positions.scheme": "none"},
    {"positions.scheme": "learned"},
    {"attention.d_head": 4},  # d_k fixed, not d_model / h
]


def build(preset: str, **kw: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return aiayn.build_model(preset, **{**SMALL, **kw}).eval()


@pytest.mark.parametrize(
    "kw", ABLATIONS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items())
)
def test_cached_decoding_equals_full_pass_in_every_family(kw: dict[str, object]) -> None:
    torch.manual_seed(3)
    dec = build("gpt2-small", **kw)
    assert isinstance(dec, DecoderLM)
    ids = torch.randint(1, 50, (2, 7))
    full = dec(ids)
    cache = dec.new_cache(2, 7)
    steps = [dec(ids[:, :3], cache=cache)] + [
        dec(ids[:, i : i + 1], cache=cache) for i in range(3, 7)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)

    ed = build("paper-base", **kw)
    assert isinstance(ed, EncoderDecoder)
    src, tgt = torch.randint(1, 50, (2, 6)), torch.randint(1, 50, (2, 5))
    src[1, 4:] = 0
    full = ed(src, tgt)
    memory, keep = ed.encode(src)
    cache = ed.new_cache(2, 5)
    steps = [ed.decode(tgt[:, :2], memory, keep, cache=cache)]
    steps += [ed.decode(tgt[:, i : i + 1], None, cache=cache) for i in range(2, 5)]
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)

    enc = build("bert-base", **kw)
    assert isinstance(enc, EncoderLM)
    ids = torch.randint(1, 50, (2, 6))
    ids[1, 4:] = 0
    out = enc(ids)
    assert out.shape == (2, 6, 50) and torch.isfinite(out).all()
    alone = enc(ids[1:, :4])  # padding keys change nothing for the real positions
    torch.testing.assert_close(out[1:, :4], alone, **TOL)


@pytest.mark.parametrize("kw", ABLATIONS[:5], ids=str)
def test_no_future_token_leaks_into_the_past(kw: dict[str, object]) -> None:
    dec = build("gpt2-small", **kw)
    ids = torch.randint(1, 50, (1, 8))
    changed = ids.clone()
    changed[0, 5:] = (changed[0, 5:] + 7) % 50
    torch.testing.assert_close(dec(changed)[:, :5], dec(ids)[:, :5])


def test_unscaled_attention_is_softmax_of_raw_dot_products() -> None:
    """attention_scale = False: softmax(Q K^T) V, by hand from the module's own projections."""
    cfg = ModelConfig.from_dict(
        {"arch": "encoder", **SMALL, "attention.scale": False, "positions.scheme": "none"}
    )
    block = Block(cfg).eval()
    attn = block.self_attn
    x = torch.randn(2, 5, 32) * 3
    q, k, v = attn.qkv(x).split(32, dim=-1)
    heads = lambda t: t.view(2, 5, 4, 8).transpose(1, 2)  # noqa: E731
    weights = torch.softmax(heads(q) @ heads(k).transpose(-1, -2), dim=-1)  # no / sqrt(8)
    expected = attn.out((weights @ heads(v)).transpose(1, 2).reshape(2, 5, 32))
    ctx = Context()
    torch.testing.assert_close(attn(x, ctx), expected, **TOL)
    scaled = Block(cfg.replace(attention={"scale": True})).eval()
    scaled.load_state_dict(block.state_dict())
    # 100 x TOL's atol: a difference well beyond fp32 rounding (seen 0.79 on CPU)
    assert not torch.allclose(scaled.self_attn(x, ctx), expected, atol=1e-3)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_without_residual_each_sublayer_replaces_the_stream(norm_position: str) -> None:
    """residual = False turns x + Sublayer(x) into Sublayer(x): the block is the composition
    of its sublayers (and norms) alone."""
    cfg = ModelConfig.from_dict(
        dict(arch="encoder", **SMALL, residual=False, norm_position=norm_position)
    )
    block = Block(cfg).eval()
    x, ctx = torch.randn(2, 5, 32), Context()
    if norm_position == "post":
        h = block.norm1(block.self_attn(x, ctx))
        expected = block.norm2(block.ffn(h))
    else:
        h = block.self_attn(block.norm1(x), ctx)
        expected = block.ffn(block.norm2(h))
    torch.testing.assert_close(block(x, ctx), expected)


def test_additive_model_scores_are_recorded_and_sum_to_one() -> None:
    dec = build("gpt2-small", attention={"score": "additive"})
    assert isinstance(dec, DecoderLM)
    _, weights = dec.forward_with_weights(torch.randint(1, 50, (1, 6)))
    assert len(weights) == 2 and weights[0].shape == (1, 4, 6, 6)
    torch.testing.assert_close(weights[0].sum(-1), torch.ones(1, 4, 6))
    assert torch.all(weights[0].triu(1) == 0)


def test_additive_parameters_train_and_bad_values_are_named() -> None:
    dec = build("gpt2-small", attention={"score": "additive"})
    w = dec.decoder.blocks[0].self_attn.score_w  # type: ignore[index,union-attr]
    assert w is not None and w.shape == (4, 8)
    ids = torch.randint(1, 50, (2, 6))
    F.cross_entropy(dec(ids).flatten(0, 1), ids.flatten()).backward()
    assert w.grad is not None and w.grad.abs().sum() > 0
    # std of 32 normal draws: relative s.d. 1 / sqrt(2 x 31) ~ 0.13, so 0.5 is ~4 s.d.
    assert math.isclose(float(w.detach().std()), 8**-0.5, rel_tol=0.5)
    with pytest.raises(ValueError, match="AttentionConfig.score='mlp'.*'dot', 'additive'"):
        ModelConfig.from_dict({"attention.score": "mlp"})
    with pytest.raises(ValueError, match="residual=1.*true or false"):
        ModelConfig.from_dict(dict(residual=1))
