"""Run configs (aiayn/training/config.py): the [model] table and ``model.*`` overrides name a
setting in any spelling -- a field, a sub-config's table, dotted, or the flat name of older
configs -- and an override wins over the file."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiayn
from aiayn.config import AttentionConfig
from aiayn.errors import DeprecatedSetting
from aiayn.training.config import load_run_config


def _write(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\npreset = "gpt2-small"\n{model}\n[train]\nmax_steps = 2\n')
    return path


def test_flat_and_nested_model_tables_read_alike(tmp_path: Path) -> None:
    with pytest.warns(DeprecatedSetting) as warned:
        flat = load_run_config(_write(tmp_path, "n_heads = 4\nn_kv_heads = 2\nd_ff = 64\n"))
    assert [str(w.message).split("; ")[1].split(" (")[0] for w in warned] == [
        "write 'attention.n_heads'",
        "write 'attention.n_kv_heads'",
        "write 'ffn.d_ff'",
    ]
    nested = load_run_config(
        _write(tmp_path, "[model.attention]\nn_heads = 4\nn_kv_heads = 2\n[model.ffn]\nd_ff = 64\n")
    )
    dotted = load_run_config(
        _write(tmp_path, 'attention.n_heads = 4\nattention.n_kv_heads = 2\n"ffn.d_ff" = 64\n')
    )
    assert flat.model == nested.model == dotted.model
    assert flat.model.attention == AttentionConfig(n_heads=4, n_kv_heads=2)
    assert flat.model.ffn.d_ff == 64 and flat.model.ffn.activation == "gelu_tanh"  # the preset's


def test_overrides_win_over_the_file_in_any_spelling(tmp_path: Path) -> None:
    path = _write(tmp_path, "[model.attention]\nn_heads = 4\n")
    with pytest.warns(DeprecatedSetting):
        assert load_run_config(path, {"model.n_heads": 2}).model.attention.n_heads == 2
    assert load_run_config(path, {"model.attention.n_heads": 3}).model.attention.n_heads == 3
    assert load_run_config(path, {"model.preset": "llama-style-small"}).model.norm == "rmsnorm"


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ("heads = 4\n", r"\[model\] in .*unknown ModelConfig field\(s\) \['heads'\]"),
        ("[model.attention]\nheads = 4\n", r"\['attention.heads'\]"),
        ("attention.n_heads = 4\n[model.attention]\nn_heads = 2\n", "not valid TOML"),
        ('"attention.n_heads" = 4\n[model.attention]\nn_heads = 2\n', "given twice"),
        ("[model.attention]\nn_heads = 0\n", "AttentionConfig.n_heads=0 is invalid"),
    ],
)
def test_bad_model_settings_are_named(tmp_path: Path, model: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_run_config(_write(tmp_path, model))


def test_fine_tuning_compares_settings_by_any_name(tmp_path: Path) -> None:
    base = aiayn.build_model(
        "gpt2-small",
        n_layers=1,
        d_model=16,
        attention={"n_heads": 2},
        ffn={"d_ff": 16},
        vocab_size=32,
        max_len=8,
    )
    aiayn.save(base, tmp_path / "base")
    path = tmp_path / "tune.toml"
    head = f'[model]\ninit_from = "{tmp_path / "base"}"\n'
    path.write_text(head + 'n_heads = 2\nattention_backend = "reference"\n')
    with pytest.warns(DeprecatedSetting):
        tuned = load_run_config(path).model  # n_heads agrees; the backend may change
    assert tuned.attention.backend == "reference" and tuned.attention.n_heads == 2
    path.write_text(head + "[model.attention]\nn_heads = 4\n")
    with pytest.raises(ValueError, match=r"contradicts .*attention.n_heads = 4 \(.* has 2\)"):
        load_run_config(path)
    path.write_text(head + 'preset = "gpt2-small"\n')
    with pytest.raises(ValueError, match="names both preset and init_from"):
        load_run_config(path)


# A run config from elsewhere: any TOML whose tables and keys are drawn mostly from the real
# ones, with values of every TOML type, is read or refused with a ValueError naming the file --
# never another exception (hypothesis; the same examples every run, tests/conftest.py).
def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)  # int, or a finite float


def _toml(tables: dict[str, dict[str, object]]) -> str:
    parts = []
    for table, values in tables.items():
        parts.append(f"[{json.dumps(table)}]")
        parts += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(parts) + "\n"


_TOML_SCALARS = (
    st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
_TOML_VALUES = _TOML_SCALARS | st.lists(_TOML_SCALARS, max_size=3)


def _keys() -> list[str]:
    from dataclasses import fields

    from aiayn.config import field_names
    from aiayn.config.run import DataConfig, TrainConfig

    return [*field_names(), *(f.name for c in (DataConfig, TrainConfig) for f in fields(c))]


@given(
    tables=st.dictionaries(
        st.sampled_from(["model", "data", "train"]) | st.text(max_size=6),
        st.dictionaries(
            st.sampled_from([*_keys(), "preset", "init_from"]) | st.text(max_size=8),
            _TOML_VALUES,
            max_size=5,
        ),
        max_size=3,
    )
)
@settings(suppress_health_check=list(HealthCheck))
def test_any_run_config_is_read_or_named(tables: dict[str, dict[str, object]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.toml"
        path.write_text(_toml(tables), encoding="utf-8")
        try:
            load_run_config(path)
        except ValueError as err:
            assert str(path) in str(err), err
