from __future__ import annotations

import dataclasses

import pytest
import torch

import aiayn
from aiayn.config import ModelConfig, field_names, get_preset


def test_presets_and_overrides() -> None:
    assert set(aiayn.presets()) >= {
        "paper-base",
        "paper-big",
        "gpt2-small",
        "llama-style-small",
        "bert-base",
    }
    cfg = get_preset("paper-base", n_layers=2, d_model=64, n_heads=4)
    assert (cfg.n_layers, cfg.d_model, cfg.head_dim, cfg.kv_heads) == (2, 64, 16, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.n_layers = 3  # type: ignore[misc]


def test_preset_sizes_match_published_models() -> None:
    with torch.device("meta"):
        sizes = {p: aiayn.build_model(p).num_parameters() for p in aiayn.presets()}
    assert sizes["gpt2-small"] == 124_439_808  # GPT-2 small as published by OpenAI / HF
    assert 108e6 < sizes["bert-base"] < 111e6  # BERT-base ~110M
    assert 60e6 < sizes["paper-base"] < 66e6 and 210e6 < sizes["paper-big"] < 216e6


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"d_model": 30, "n_heads": 4}, "d_model=30 .*multiple of n_heads=4"),
        ({"n_heads": 8, "n_kv_heads": 3}, "n_heads=8 .*multiple of n_kv_heads=3"),
        ({"positional": "t5"}, "positional='t5'.*'sinusoidal'"),
        ({"norm": "batchnorm"}, "norm='batchnorm'"),
        ({"norm_position": "sandwich"}, "norm_position"),
        ({"activation": "tanh"}, "activation='tanh'"),
        ({"attention_backend": "cuda"}, "attention_backend"),
        ({"arch": "rnn"}, "arch='rnn'"),
        ({"n_layers": 0}, "n_layers=0.*positive"),
        ({"d_model": 512.0}, "d_model=512.0.*integer"),
        ({"dropout": 1.5}, r"dropout=1.5.*\[0, 1\)"),
        ({"pad_id": 40000}, "pad_id=40000"),
        ({"src_vocab_size": 100}, "tie_embeddings.*shared vocabulary"),
        ({"positional": "rope", "d_head": 7}, "d_head=7.*even"),
        ({"layers": 3}, r"unknown ModelConfig field\(s\) \['layers'\]"),
        # TOML and --set give any type: the string "False" is truthy, and was taken as true.
        ({"bias": "False"}, "ModelConfig.bias='False' is invalid: expected true or false"),
        ({"tie_embeddings": 0}, "tie_embeddings=0 is invalid: expected true or false"),
        ({"dropout": "high"}, "dropout='high' is invalid: expected a number"),
        ({"norm_eps": "abc"}, "norm_eps='abc' is invalid: expected a number"),
        ({"n_kv_heads": "2"}, "n_kv_heads='2' is invalid: expected an integer or None"),
    ],
)
def test_bad_configs_name_the_value(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_preset("paper-base", **overrides)


def test_decoder_only_rejects_encoder_decoder_fields() -> None:
    with pytest.raises(ValueError, match="n_decoder_layers"):
        get_preset("gpt2-small", n_decoder_layers=2)


def test_unknown_preset() -> None:
    with pytest.raises(ValueError, match="unknown preset 'paper-huge'.*paper-base"):
        aiayn.build_model("paper-huge")
    with pytest.raises(ValueError, match="preset name or a ModelConfig"):
        aiayn.build_model(3)  # type: ignore[arg-type]


def test_json_round_trip() -> None:
    for name in aiayn.presets():
        cfg = get_preset(name)
        assert ModelConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="not valid JSON"):
        ModelConfig.from_json("{")
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        ModelConfig.from_dict({"wat": 1})
    assert "d_model" in field_names()


def test_initialisations() -> None:
    torch.manual_seed(0)
    kw = dict(n_layers=2, d_model=256, n_heads=4, d_ff=1024, vocab_size=100)
    paper = aiayn.build_model("paper-base", **kw)
    assert paper.config.init == "xavier"
    w = paper.encoder.blocks[0].ffn.w1.weight  # (1024, 256)
    bound = (6 / (256 + 1024)) ** 0.5  # Glorot uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out))
    assert w.abs().max() <= bound and abs(w.std().item() - bound / 3**0.5) < 0.002
    gpt = aiayn.build_model("gpt2-small", **kw)
    assert gpt.config.init == "scaled-normal"
    assert abs(gpt.decoder.blocks[0].ffn.w1.weight.std().item() - 0.02) < 0.001
    shrunk = 0.02 / (2 * 2) ** 0.5  # residual projections / sqrt(2N), N = 2 layers
    assert abs(gpt.decoder.blocks[0].ffn.w2.weight.std().item() - shrunk) < 0.001
    with pytest.raises(ValueError, match="init='he'"):
        get_preset("paper-base", init="he")
