"""Recorded scores reproduce the weights the model used, and reweighting behaves like Eq. (1)."""

import pytest
import torch

from aiayn.config import get_preset
from aiayn.inspect.scores import recorded_scores, reweight
from aiayn.models import build_model

# fp32 summed in another order: a 64-term dot moves up to 64 x 2^-24 ~ 4e-6; CPU: <= 6e-8
TOL = {"atol": 1e-5, "rtol": 1e-5}


def _small(preset: str, **extra):
    torch.manual_seed(0)
    fields = {
        "n_layers": 2,
        "d_model": 32,
        "attention.n_heads": 4,
        "ffn.d_ff": 64,
        "vocab_size": 20,
        "max_len": 32,
    }
    if preset == "paper-base":
        fields["src_vocab_size"] = 20
    return build_model(get_preset(preset, **fields, **extra)).eval()


@pytest.mark.parametrize("preset", ["gpt2-small", "llama-style-small", "bert-base"])
def test_recorded_scores_give_back_the_models_weights(preset):
    extra = {"attention.n_kv_heads": 2} if preset == "llama-style-small" else {}
    model = _small(preset, **extra)
    ids = torch.randint(1, 20, (1, 9))
    with torch.no_grad():
        expected_logits, expected = model.forward_with_weights(ids)
        recorded = recorded_scores(model, ids)
        logits = model(ids)
    torch.testing.assert_close(logits, expected_logits, **TOL)
    assert [r.layer for r in recorded] == [0, 1]
    causal = model.config.arch == "decoder"
    for r, w in zip(recorded, expected, strict=True):
        assert r.stream == ("self" if causal else "encoder") and r.causal is causal
        assert r.scores.shape == (1, 4, 9, 9)
        torch.testing.assert_close(reweight(r.scores, causal=causal), w, **TOL)


def test_encoder_decoder_streams_in_order():
    model = _small("paper-base")
    src, tgt = torch.randint(1, 20, (1, 7)), torch.randint(1, 20, (1, 5))
    with torch.no_grad():
        _, w = model.forward_with_weights(src, tgt)
        recorded = recorded_scores(model, src, tgt)
    streams = [(r.stream, r.layer) for r in recorded]
    assert streams == [
        ("encoder", 0),
        ("encoder", 1),
        ("decoder", 0),
        ("cross", 0),
        ("decoder", 1),
        ("cross", 1),
    ]
    cross = [r for r in recorded if r.stream == "cross"]
    assert cross[0].scores.shape == (1, 4, 5, 7)
    for r, ref in zip(cross, w["cross"], strict=True):
        torch.testing.assert_close(reweight(r.scores), ref, **TOL)


def test_reweight_temperature_and_mask():
    scores = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.0, -0.5], [2.0, 2.0, 2.0]])
    base = reweight(scores)
    sharp, flat = reweight(scores, temperature=0.25), reweight(scores, temperature=4.0)
    assert sharp[0].max() > base[0].max() > flat[0].max()  # lower temperature, sharper rows
    torch.testing.assert_close(reweight(scores, temperature=0.5), torch.softmax(scores * 2, -1))
    causal = reweight(scores, causal=True)
    assert torch.equal(causal.triu(1), torch.zeros(3, 3))
    torch.testing.assert_close(causal[1, :2], torch.softmax(scores[1, :2], -1))
    torch.testing.assert_close(causal.sum(-1), torch.ones(3))
    with pytest.raises(ValueError, match="temperature"):
        reweight(scores, temperature=0)


def test_sliding_window_scores_reweight_to_the_layers_own_weights():
    model = _small("gpt2-small", attention={"sliding_window": 3})
    ids = torch.randint(1, 20, (1, 9))
    with torch.no_grad():
        _, expected = model.forward_with_weights(ids)
        recorded = recorded_scores(model, ids)
    for r, w in zip(recorded, expected, strict=True):
        assert r.window == 3
        weights = reweight(r.scores, causal=True, window=r.window)
        torch.testing.assert_close(weights, w, **TOL)
        assert torch.equal(weights[..., 5, :3], torch.zeros(1, 4, 3))  # 3 or more back: unseen
