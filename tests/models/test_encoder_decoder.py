"""The paper's encoder-decoder: equal to torch.nn.Transformer, no leaks, cache, sizes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import aiayn
from aiayn.models import EncoderDecoder
from aiayn.nn.masks import causal_mask
from tests.conftest import tiny_model

# fp32 summed in another order: a 64-term dot moves up to 64 x 2^-24 ~ 4e-6; CPU: <= 1.4e-6
TOL = {"atol": 1e-5, "rtol": 1e-5}


def small(**kw: object) -> EncoderDecoder:
    model = tiny_model("paper-base", **{"vocab_size": 50, "max_len": 64, **kw})
    assert isinstance(model, EncoderDecoder)
    return model


def _copy_ln(dst: nn.Module, src: nn.Module) -> None:
    dst.load_state_dict(src.state_dict())


def test_equals_torch_nn_transformer() -> None:
    ours = small(n_decoder_layers=3)
    ref = nn.Transformer(
        d_model=32,
        nhead=4,
        num_encoder_layers=2,
        num_decoder_layers=3,
        dim_feedforward=64,
        dropout=0.0,
        batch_first=True,
    ).eval()
    ref.encoder.norm = None  # the paper's post-LN has no final norm; nn.Transformer adds one
    ref.decoder.norm = None
    with torch.no_grad():
        for p in ref.parameters():  # move norms off their 1/0 defaults, so copying matters
            p.add_(0.01 * torch.randn_like(p))
        for ours_b, ref_l in zip(ours.encoder.blocks, ref.encoder.layers, strict=True):
            ours_b.self_attn.load_from_torch(ref_l.self_attn)
            ours_b.ffn.w1.load_state_dict(ref_l.linear1.state_dict())
            ours_b.ffn.w2.load_state_dict(ref_l.linear2.state_dict())
            _copy_ln(ours_b.norm1, ref_l.norm1)
            _copy_ln(ours_b.norm2, ref_l.norm2)
        for ours_b, ref_l in zip(ours.decoder.blocks, ref.decoder.layers, strict=True):
            ours_b.self_attn.load_from_torch(ref_l.self_attn)
            ours_b.cross_attn.load_from_torch(ref_l.multihead_attn)
            ours_b.ffn.w1.load_state_dict(ref_l.linear1.state_dict())
            ours_b.ffn.w2.load_state_dict(ref_l.linear2.state_dict())
            _copy_ln(ours_b.norm1, ref_l.norm1)
            _copy_ln(ours_b.norm_cross, ref_l.norm2)  # torch's norm2 follows cross-attention
            _copy_ln(ours_b.norm2, ref_l.norm3)
    src = torch.randint(1, 50, (3, 9))
    src[1, 6:] = 0  # padding (pad_id = 0)
    tgt = torch.randint(1, 50, (3, 7))
    keep = src != 0
    pos_s, pos_t = torch.arange(9), torch.arange(7)
    expected = ours.head(
        ref(
            ours.src_embed(src, pos_s),
            ours.tgt_embed(tgt, pos_t),
            tgt_mask=~causal_mask(7),
            src_key_padding_mask=~keep,
            memory_key_padding_mask=~keep,
        )
    )
    torch.testing.assert_close(ours(src, tgt), expected, **TOL)
    ref_backend = aiayn.build_model(ours.config.replace(attention={"backend": "reference"})).eval()
    ref_backend.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ref_backend(src, tgt), expected, **TOL)


def test_weight_tying_three_ways() -> None:
    model = small()
    assert model.src_embed.token.weight is model.tgt_embed.token.weight
    assert model.head.weight is model.src_embed.token.weight
    untied = small(tie_embeddings=False, src_vocab_size=70)
    assert untied.src_embed.token.weight.shape == (70, 32)
    assert untied.head.weight is not untied.tgt_embed.token.weight
    assert untied.num_parameters() == model.num_parameters() + 70 * 32 + 50 * 32


def test_source_padding_leaks_nothing() -> None:
    model = small()
    src = torch.randint(1, 50, (2, 8))
    src[0, 5:] = 0
    tgt = torch.randint(1, 50, (2, 6))
    base = model(src, tgt)
    # What sits in padded slots must not matter: use an explicit mask and change those ids.
    keep = src != 0
    noisy = src.clone()
    noisy[0, 5:] = torch.randint(1, 50, (3,))
    torch.testing.assert_close(model(noisy, tgt, src_mask=keep), base)
    # And a batch row's result does not depend on how much padding the batch needs.
    alone = model(src[:1, :5], tgt[:1])
    torch.testing.assert_close(alone, base[:1], **TOL)


def test_decoder_is_causal() -> None:
    model = small()
    src, tgt = torch.randint(1, 50, (1, 6)), torch.randint(1, 50, (1, 8))
    base = model(src, tgt)
    changed = tgt.clone()
    changed[0, 5:] = (changed[0, 5:] + 7) % 50
    torch.testing.assert_close(model(src, changed)[:, :5], base[:, :5])


def test_cached_decoding_equals_full_pass() -> None:
    for kw in (
        {},
        {"positions.scheme": "learned"},
        {"positions.scheme": "rope", "attention.n_kv_heads": 2},
    ):
        model = small(**kw)
        src = torch.randint(1, 50, (2, 7))
        src[1, 4:] = 0
        tgt = torch.randint(1, 50, (2, 6))
        full = model(src, tgt)
        memory, keep = model.encode(src)
        cache = model.new_cache(2, 6)
        steps = [model.decode(tgt[:, :2], memory, keep, cache=cache)]
        steps += [model.decode(tgt[:, i : i + 1], None, cache=cache) for i in range(2, 6)]
        torch.testing.assert_close(torch.cat(steps, 1), full, **TOL)


def test_attention_weights_shapes() -> None:
    model = small()
    src, tgt = torch.randint(1, 50, (2, 7)), torch.randint(1, 50, (2, 5))
    logits, w = model.forward_with_weights(src, tgt)
    torch.testing.assert_close(logits, model(src, tgt), **TOL)
    assert [x.shape for x in w["encoder"]] == [(2, 4, 7, 7)] * 2
    assert [x.shape for x in w["decoder"]] == [(2, 4, 5, 5)] * 2
    assert [x.shape for x in w["cross"]] == [(2, 4, 5, 7)] * 2
    assert (w["decoder"][0].triu(1) == 0).all()


def test_bad_inputs() -> None:
    model = small()
    with pytest.raises(ValueError, match="max_len=64"):
        model(torch.randint(1, 50, (1, 65)), torch.randint(1, 50, (1, 3)))
    with pytest.raises(ValueError, match="integer"):
        model(torch.randn(1, 4), torch.randint(1, 50, (1, 3)))
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        model(torch.full((1, 4), 50), torch.randint(1, 50, (1, 3)))
    with pytest.raises(ValueError, match=r"shape \(batch, length\)"):
        model(torch.randint(1, 50, (4,)), torch.randint(1, 50, (1, 3)))
    with pytest.raises(ValueError, match="src_mask"):
        model(torch.randint(1, 50, (1, 4)), torch.randint(1, 50, (1, 3)), src_mask=torch.ones(1, 3))


def test_paper_parameter_counts() -> None:
    # Table 3: base ~65M, big ~213M, shared source/target BPE vocabulary of 37,000 (§5.1).
    with torch.device("meta"):
        base = aiayn.build_model("paper-base")
        big = aiayn.build_model("paper-big")
    assert base.num_parameters() == 63_082_496
    assert big.num_parameters() == 214_245_376
    # Hand count for base: embedding 37000*512 (shared three ways) + 6 encoder layers
    # (4*(512^2+512) attention + 2*512*2048+2048+512 FFN + 2*1024 norms) + 6 decoder layers
    # (two attentions, FFN, three norms).
    enc = 4 * (512 * 512 + 512) + (512 * 2048 + 2048 + 2048 * 512 + 512) + 2 * 1024
    dec = 8 * (512 * 512 + 512) + (512 * 2048 + 2048 + 2048 * 512 + 512) + 3 * 1024
    assert base.num_parameters() == 37000 * 512 + 6 * enc + 6 * dec
