"""Encoder-only (BERT-style): permutation equivariance without positions, padding, MLM head."""

from __future__ import annotations

import pytest
import torch

from aiayn.models import EncoderLM
from tests.conftest import tiny_model

# fp32 summed in another order: a 64-term dot moves up to 64 x 2^-24 ~ 4e-6; CPU: <= 4.8e-7
TOL = {"atol": 1e-5, "rtol": 1e-5}


def small(**kw: object) -> EncoderLM:
    model = tiny_model("bert-base", **{"vocab_size": 40, "max_len": 16, **kw})
    assert isinstance(model, EncoderLM)
    return model


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_permutation_equivariant_without_positions(norm_position: str) -> None:
    model = small(positions={"scheme": "none"}, norm_position=norm_position)
    ids = torch.randint(1, 40, (2, 9))
    perm = torch.randperm(9)
    out = model.encode(ids)
    torch.testing.assert_close(model.encode(ids[:, perm]), out[:, perm], **TOL)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope"])
def test_positions_break_the_symmetry(positional: str) -> None:
    model = small(
        positions={"scheme": positional}, init_std=0.3
    )  # large enough for non-uniform attention
    ids = torch.randint(1, 40, (1, 9))
    perm = torch.tensor([8, 7, 6, 5, 4, 3, 2, 1, 0])
    # 100 x TOL's atol: a difference well beyond fp32 rounding (seen >= 0.8 on CPU)
    assert not torch.allclose(model.encode(ids[:, perm]), model.encode(ids)[:, perm], atol=1e-3)


def test_padding_leaks_nothing() -> None:
    model = small()
    ids = torch.randint(1, 40, (2, 10))
    ids[1, 6:] = 0
    out = model(ids)
    alone = model(ids[1:, :6])
    torch.testing.assert_close(out[1:, :6], alone, **TOL)
    mask = ids != 0
    noisy = ids.clone()
    noisy[1, 6:] = 7
    torch.testing.assert_close(model(noisy, attention_mask=mask)[1, :6], out[1, :6])


def test_mlm_head_tied_and_weights() -> None:
    model = small()
    assert model.head.proj.weight is model.embed.token.weight
    logits, weights = model.forward_with_weights(torch.randint(1, 40, (2, 5)))
    assert logits.shape == (2, 5, 40)
    assert weights[0].shape == (2, 4, 5, 5) and (weights[0].triu(1) != 0).any()  # bidirectional
