"""``aiayn.train``, the library call behind ``aiayn train``: a config file or a
``RunConfig`` in, a run folder out, the same model either way."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.config.run import RunConfig
from aiayn.errors import ConfigError
from aiayn.training.config import load_run_config
from tests.conftest import LM_TEXT, LM_TOML


def _files(root: Path) -> Path:
    (root / "corpus.txt").write_text(LM_TEXT)
    (root / "run.toml").write_text(LM_TOML)
    return root / "run.toml"


def test_a_config_file_and_its_run_config_train_the_same_model(tmp_path: Path) -> None:
    toml = _files(tmp_path)
    by_file = aiayn.train(toml, tmp_path / "a", data=tmp_path, overrides={"train.max_steps": 4})
    run = load_run_config(toml, {"train.max_steps": 4})
    by_config = aiayn.train(run, tmp_path / "b", data=tmp_path)
    assert by_file.step == by_config.step == 4
    a, b = aiayn.load(by_file.checkpoint).model, aiayn.load(by_config.checkpoint).model
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    again = aiayn.train(run, tmp_path / "b", data=tmp_path, resume=True)
    assert again.already_complete and again.step == 4


def test_overrides_belong_to_a_file_not_a_run_config(tmp_path: Path) -> None:
    run = load_run_config(_files(tmp_path))
    assert isinstance(run, RunConfig)
    with pytest.raises(ConfigError, match="overrides apply to a config file"):
        aiayn.train(run, tmp_path / "out", overrides={"train.max_steps": 1})
