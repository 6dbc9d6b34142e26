from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.config import (
    FLAT_NAMES,
    AttentionConfig,
    FeedForwardConfig,
    MixerConfig,
    ModelConfig,
    PositionConfig,
    RNNConfig,
    VisionConfig,
    differing_fields,
    dotted_settings,
    field_names,
    get_preset,
)
from aiayn.errors import DeprecatedSetting


def test_presets_and_overrides() -> None:
    assert set(aiayn.presets()) >= {
        "paper-base",
        "paper-big",
        "gpt2-small",
        "llama-style-small",
        "bert-base",
    }
    cfg = get_preset("paper-base", n_layers=2, d_model=64, attention={"n_heads": 4})
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
        (
            {"d_model": 30, "attention.n_heads": 4},
            r"ModelConfig.d_model=30 .*multiple of attention.n_heads=4",
        ),
        (
            {"attention": {"n_heads": 8, "n_kv_heads": 3}},
            "AttentionConfig.n_heads=8 .*multiple of n_kv_heads=3",
        ),
        ({"positions.scheme": "t5"}, "PositionConfig.scheme='t5'.*'sinusoidal'"),
        ({"norm": "batchnorm"}, "ModelConfig.norm='batchnorm'"),
        ({"norm_position": "sandwich"}, "norm_position"),
        ({"ffn.activation": "tanh"}, "FeedForwardConfig.activation='tanh'"),
        ({"attention.backend": "cuda"}, "AttentionConfig.backend='cuda'"),
        ({"arch": "rnn"}, "arch='rnn'"),
        ({"n_layers": 0}, "n_layers=0.*positive"),
        ({"d_model": 512.0}, "d_model=512.0.*integer"),
        ({"dropout": 1.5}, r"dropout=1.5.*\[0, 1\)"),
        ({"pad_id": 40000}, "pad_id=40000"),
        ({"src_vocab_size": 100}, "tie_embeddings.*shared vocabulary"),
        ({"positions.scheme": "rope", "attention.d_head": 7}, "attention.d_head=7.*even"),
        ({"layers": 3}, r"unknown ModelConfig field\(s\) \['layers'\]"),
        # TOML and --set give any type: the string "False" is truthy, and was taken as true.
        ({"bias": "False"}, "ModelConfig.bias='False' is invalid: expected true or false"),
        ({"tie_embeddings": 0}, "tie_embeddings=0 is invalid: expected true or false"),
        ({"dropout": "high"}, "dropout='high' is invalid: expected a number"),
        ({"norm_eps": "abc"}, "norm_eps='abc' is invalid: expected a number"),
        (
            {"attention.n_kv_heads": "2"},
            "AttentionConfig.n_kv_heads='2' is invalid: expected an integer or None",
        ),
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
    kw = dict(n_layers=2, d_model=256, attention={"n_heads": 4}, ffn={"d_ff": 1024}, vocab_size=100)
    paper = aiayn.build_model("paper-base", **kw)
    assert paper.config.init == "xavier"
    w = paper.encoder.blocks[0].ffn.w1.weight  # (1024, 256)
    bound = (6 / (256 + 1024)) ** 0.5  # Glorot uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out))
    # 262144 uniform draws: the std's sampling s.d. is ~3.4e-5; 0.002 (5 % of 0.04) is loose
    assert w.abs().max() <= bound and abs(w.std().item() - bound / 3**0.5) < 0.002
    gpt = aiayn.build_model("gpt2-small", **kw)
    assert gpt.config.init == "scaled-normal"
    # 262144 normal draws: the std's s.d. is 0.02 / sqrt(2 x 262144) ~ 2.8e-5; 0.001 is loose
    assert abs(gpt.decoder.blocks[0].ffn.w1.weight.std().item() - 0.02) < 0.001
    shrunk = 0.02 / (2 * 2) ** 0.5  # residual projections / sqrt(2N), N = 2 layers
    # sampling s.d. ~1.4e-5; 0.001 is a tenth of the 0.01 gap to the unshrunk 0.02
    assert abs(gpt.decoder.blocks[0].ffn.w2.weight.std().item() - shrunk) < 0.001
    with pytest.raises(ValueError, match="init='he'"):
        get_preset("paper-base", init="he")


# config.json of a tiny llama-style model as aiayn wrote it before the sub-configs: flat.
FLAT_CONFIG = {
    "activation": "swiglu",
    "arch": "decoder",
    "attention_backend": "sdpa",
    "attention_dropout": 0.0,
    "attention_every": None,
    "attention_scale": True,
    "attention_score": "dot",
    "bias": False,
    "channels": 3,
    "d_ff": 64,
    "d_head": None,
    "d_model": 32,
    "dropout": 0.0,
    "embedding_norm": False,
    "expert_capacity_factor": None,
    "experts_top_k": 2,
    "head_bias": False,
    "image_size": None,
    "init": "scaled-normal",
    "init_std": 0.02,
    "max_len": 16,
    "mixer": "attention",
    "mlm_head": True,
    "n_classes": None,
    "n_decoder_layers": None,
    "n_experts": None,
    "n_heads": 4,
    "n_kv_heads": 2,
    "n_layers": 2,
    "norm": "rmsnorm",
    "norm_eps": 1e-06,
    "norm_position": "pre",
    "pad_id": None,
    "patch_size": 16,
    "pool": "cls",
    "pooler": False,
    "positional": "rope",
    "qkv_bias": None,
    "residual": True,
    "rnn": None,
    "rnn_attention": True,
    "rope_base": 10000.0,
    "rope_scaling": 1.0,
    "scale_embeddings": False,
    "sliding_window": None,
    "src_vocab_size": None,
    "ssm_conv": 4,
    "ssm_expand": 2,
    "ssm_head_dim": 64,
    "ssm_state": 16,
    "tie_embeddings": False,
    "type_vocab_size": 0,
    "vocab_size": 50,
}


def test_flat_names_go_to_their_sub_config_with_a_warning() -> None:
    with pytest.warns(DeprecatedSetting) as flat:
        cfg = get_preset(
            "gpt2-small",
            n_heads=4,
            n_kv_heads=2,
            attention_dropout=0.1,
            attention_scale=False,
            positional="rope",
            rope_base=500.0,
            d_ff=64,
            activation="swiglu",
            n_experts=4,
            experts_top_k=1,
            expert_capacity_factor=1.5,
            mixer="linear",
            attention_every=2,
        )
    assert len(flat) == 13
    assert cfg.attention == AttentionConfig(n_heads=4, n_kv_heads=2, dropout=0.1, scale=False)
    assert cfg.positions == PositionConfig(scheme="rope", rope_base=500.0)
    assert cfg.ffn == FeedForwardConfig(
        d_ff=64, activation="swiglu", n_experts=4, top_k=1, capacity_factor=1.5
    )
    assert cfg.mixer == MixerConfig(kind="linear", attention_every=2)
    with pytest.warns(DeprecatedSetting):
        rnn = get_preset("paper-base", rnn="lstm", rnn_attention=False)
    assert rnn.rnn == RNNConfig(cell="lstm", attention=False)
    with pytest.warns(DeprecatedSetting):
        vit = get_preset(
            "bert-base", image_size=32, patch_size=8, channels=1, n_classes=10, pool="mean"
        )
    assert vit.vision == VisionConfig(
        image_size=32, patch_size=8, channels=1, n_classes=10, pool="mean"
    )
    # Every flat name has a place, and every place is a field.
    assert set(FLAT_NAMES.values()) <= set(field_names())


@pytest.mark.parametrize("flat", sorted(FLAT_NAMES))
def test_each_flat_name_warns_naming_the_one_to_write(flat: str) -> None:
    part, _, inner = FLAT_NAMES[flat].partition(".")
    value = getattr(getattr(get_preset("gpt2-small"), part), inner)
    expected = f"'{flat}' is the flat spelling.*write '{part}.{inner}'.*under \\[model.{part}\\]"
    with pytest.warns(DeprecatedSetting, match=expected):
        assert get_preset("gpt2-small", **{flat: value}) == get_preset("gpt2-small")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the dotted name and the table are read silently
        get_preset("gpt2-small", **{f"{part}.{inner}": value})
        get_preset("gpt2-small", **{part: {inner: value}})


def test_nested_and_dotted_settings() -> None:
    base = get_preset("gpt2-small")
    by_table = base.replace(attention={"n_heads": 4}, ffn={"d_ff": 64})
    by_dots = base.replace(**{"attention.n_heads": 4, "ffn.d_ff": 64})
    by_object = base.replace(
        attention=AttentionConfig(n_heads=4),
        ffn=base.ffn.__class__(d_ff=64, activation="gelu_tanh"),
    )
    with pytest.warns(DeprecatedSetting):
        assert by_table == by_dots == by_object == base.replace(n_heads=4, d_ff=64)
    # A table changes only the fields it names; the preset's others stay.
    assert by_table.ffn.activation == "gelu_tanh" and by_table.positions.scheme == "learned"
    assert ModelConfig.from_dict(by_table.to_dict()) == by_table
    with pytest.warns(DeprecatedSetting):
        dotted = dotted_settings({"n_heads": 2, "ffn": {"d_ff": 8}, "d_model": 16})
    assert dotted == {"attention.n_heads": 2, "ffn.d_ff": 8, "d_model": 16}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"wat": 1}, r"unknown ModelConfig field\(s\) \['wat'\]; expected"),
        ({"top_k": 1}, r"\['top_k'\] \(did you mean ffn.top_k\?\)"),
        ({"attention.wat": 1}, r"unknown ModelConfig field\(s\) \['attention.wat'\]"),
        ({"attention": {"n_head": 2}}, r"\['attention.n_head'\]"),
        ({"positions.positional": "rope"}, r"\['positions.positional'\]"),
        ({"attention": {"n_heads": 2}, "attention.n_heads": 4}, "attention.n_heads is given twice"),
        ({"attention": 4}, r"ModelConfig.attention=4 is invalid: expected a sub-config"),
    ],
)
def test_unknown_or_repeated_settings_are_refused(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_preset("paper-base", **overrides)


@pytest.mark.parametrize(
    ("part", "fields", "match"),
    [
        (
            AttentionConfig,
            {"n_heads": 0},
            "AttentionConfig.n_heads=0 is invalid: expected a positive",
        ),
        (AttentionConfig, {"dropout": 1.0}, r"AttentionConfig.dropout=1.0 .*\[0, 1\)"),
        (
            AttentionConfig,
            {"score": "cosine"},
            "AttentionConfig.score='cosine' .*'dot', 'additive'",
        ),
        (AttentionConfig, {"sliding_window": 0}, "AttentionConfig.sliding_window=0 .*or None"),
        (
            PositionConfig,
            {"rope_base": 0.0},
            "PositionConfig.rope_base=0.0 is invalid: expected > 0",
        ),
        (PositionConfig, {"rope_scaling": -1.0}, "PositionConfig.rope_scaling=-1.0"),
        (FeedForwardConfig, {"d_ff": 0}, "FeedForwardConfig.d_ff=0 .*positive"),
        (
            FeedForwardConfig,
            {"n_experts": 2, "top_k": 3},
            "FeedForwardConfig.top_k=3 .*n_experts=2",
        ),
        (FeedForwardConfig, {"capacity_factor": 0.0}, "FeedForwardConfig.capacity_factor=0.0"),
        (MixerConfig, {"kind": "rnn"}, "MixerConfig.kind='rnn' .*'attention', 'linear', 'ssm'"),
        (MixerConfig, {"attention_every": 2}, "MixerConfig.attention_every=2 .*kind='attention'"),
        (MixerConfig, {"kind": "ssm", "ssm_state": 0}, "MixerConfig.ssm_state=0"),
        (RNNConfig, {"cell": "rnn"}, "RNNConfig.cell='rnn' .*'gru', 'lstm' or None"),
        (RNNConfig, {"attention": "yes"}, "RNNConfig.attention='yes' .*true or false"),
        (
            VisionConfig,
            {"image_size": 30},
            "VisionConfig.image_size=30 .*multiple of patch_size=16",
        ),
        (VisionConfig, {"image_size": 32, "n_classes": 1}, "VisionConfig.n_classes=1 .*at least 2"),
        (VisionConfig, {"pool": "max"}, "VisionConfig.pool='max' .*'cls', 'mean'"),
    ],
)
def test_each_sub_config_names_its_bad_value(part: type, fields: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        part(**fields)
    with pytest.raises(ValueError, match=match):  # the same, reached from a ModelConfig
        get_preset("paper-base", **{f"{_part_name(part)}.{k}": v for k, v in fields.items()})


def _part_name(part: type) -> str:
    return {f.type: f.name for f in dataclasses.fields(ModelConfig)}[part.__name__]


@pytest.mark.parametrize(
    ("preset", "overrides", "match"),
    [
        ("paper-base", {"mixer.kind": "ssm"}, "ModelConfig.mixer.kind='ssm' .*decoder only"),
        (
            "gpt2-small",
            {"mixer.kind": "ssm", "attention.sliding_window": 4},
            "attention.sliding_window=4",
        ),
        (
            "gpt2-small",
            {"mixer.kind": "linear", "positions.scheme": "alibi"},
            "positions.scheme='alibi'",
        ),
        (
            "gpt2-small",
            {"mixer.kind": "ssm", "mixer.ssm_head_dim": 100},
            "mixer.ssm_head_dim=100 .*divisor",
        ),
        (
            "gpt2-small",
            {"vision.image_size": 32, "vision.n_classes": 2},
            "vision.image_size=32 .*an encoder",
        ),
        (
            "bert-base",
            {"vision.image_size": 32, "vision.n_classes": 2, "positions.scheme": "rope"},
            "positions.scheme",
        ),
        ("gpt2-small", {"rnn.cell": "gru"}, "ModelConfig.rnn.cell='gru' .*RNN baselines translate"),
        ("bert-base", {"attention.sliding_window": 4}, "attention.sliding_window=4 .*it is causal"),
    ],
)
def test_cross_field_checks_name_the_setting(preset: str, overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        get_preset(preset, **overrides)


def test_sub_configs_of_another_type_are_refused() -> None:
    with pytest.raises(
        ValueError, match="ModelConfig.ffn=.*expected a sub-config \\(FeedForwardConfig\\)"
    ):
        ModelConfig(ffn=AttentionConfig())  # type: ignore[arg-type]


def test_json_is_nested_and_round_trips() -> None:
    cfg = get_preset("llama-style-small", ffn={"n_experts": 4}, attention={"sliding_window": 8})
    data = json.loads(cfg.to_json())
    assert data["attention"]["n_kv_heads"] == 4 and data["attention"]["sliding_window"] == 8
    assert data["positions"] == {"scheme": "rope", "rope_base": 10000.0, "rope_scaling": 1.0}
    assert data["ffn"]["n_experts"] == 4 and "n_heads" not in data and "d_ff" not in data
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert hash(ModelConfig.from_json(cfg.to_json())) == hash(cfg)


def test_flat_config_json_of_older_checkpoints_loads(tmp_path: Path) -> None:
    cfg = ModelConfig.from_json(json.dumps(FLAT_CONFIG))  # silently: a stored file
    assert cfg == get_preset(
        "llama-style-small",
        n_layers=2,
        d_model=32,
        attention={"n_heads": 4, "n_kv_heads": 2},
        ffn={"d_ff": 64},
        vocab_size=50,
        max_len=16,
    )
    torch.manual_seed(0)
    model = aiayn.build_model(cfg).eval()
    aiayn.save(model, tmp_path / "old")
    (tmp_path / "old" / "manifest.json").unlink()  # an older aiayn's folder: no manifest
    (tmp_path / "old" / "config.json").write_text(json.dumps(FLAT_CONFIG))
    loaded = aiayn.load_model(tmp_path / "old").eval()
    assert loaded.config == cfg
    ids = torch.randint(0, 50, (1, 6))
    # the same weights through the same kernels: bit for bit
    torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)


def test_value_reads_any_spelling() -> None:
    cfg = get_preset("llama-style-small")
    assert cfg.value("attention.n_heads") == cfg.attention.n_heads == 12
    with pytest.warns(DeprecatedSetting, match="'n_heads' .* write 'attention.n_heads'"):
        assert cfg.value("n_heads") == 12
    with pytest.warns(DeprecatedSetting, match="write 'mixer.kind'"):
        assert cfg.value("mixer") == "attention"  # flat: the kind
    assert cfg.value("attention") == cfg.attention and cfg.value("d_model") == 768
    assert (cfg.value("head_dim"), cfg.value("kv_heads"), cfg.value("projection_bias")) == (
        64,
        4,
        False,
    )
    with pytest.raises(ValueError, match="unknown ModelConfig field 'heads'"):
        cfg.value("heads")


def test_differing_fields_are_dotted() -> None:
    a = get_preset("gpt2-small")
    b = a.replace(attention={"n_heads": 4}, d_model=256, positions={"rope_scaling": 2.0})
    assert differing_fields(a, b) == ["d_model", "attention.n_heads", "positions.rope_scaling"]
    assert differing_fields(a, b, skip=("attention.n_heads", "positions")) == ["d_model"]


ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_shipped_run_configs_write_each_setting_one_way(path: Path) -> None:
    from aiayn.training.config import load_run_config

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedSetting)
        load_run_config(path)


@pytest.mark.parametrize(
    "path", sorted((ROOT / "experiments").glob("*.toml")), ids=lambda p: p.name
)
def test_shipped_sweeps_write_each_setting_one_way(path: Path) -> None:
    from aiayn.experiment import load_sweep

    sweep = load_sweep(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedSetting)
        for variant in sweep.variants:
            sweep.run_config(variant)
