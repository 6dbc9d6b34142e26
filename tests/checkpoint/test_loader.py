"""aiayn.load: one loader for an aiayn checkpoint, a training run's folder and (in
tests/interop) a Hugging Face folder; a path that is none of them is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.checkpoint import RunDir, TrainState, read_model_config, save_bundle
from aiayn.data.tokenizer import CharTokenizer
from tests.conftest import tiny_model

CHARS = list("abcdefghijklmnopqrstuvwxyz ")


def test_a_checkpoint_and_a_run_folder_load_the_same_bundle(tmp_path: Path) -> None:
    model = tiny_model("gpt2-small", vocab_size=len(CHARS), max_len=16)
    tokenizer = CharTokenizer(CHARS)
    save_bundle(tmp_path / "ckpt", model, tokenizer, {"note": "x"})
    state = TrainState(step=3, optimizer={}, torch_rng=torch.get_rng_state(), data={})
    RunDir(tmp_path / "run").save_checkpoint(model, tokenizer, {"note": "x"}, state)
    ids = torch.tensor([tokenizer.encode("a cat")])
    for path in (tmp_path / "ckpt", tmp_path / "run", tmp_path / "run" / "checkpoint"):
        bundle = aiayn.load(path)
        assert bundle.run == {"note": "x"} and bundle.tokenizer.encode("ab") == [0, 1]
        # the same weights through the same kernels: bit for bit
        torch.testing.assert_close(bundle.model.eval()(ids), model(ids), atol=0, rtol=0)
        assert read_model_config(path) == model.config
    assert aiayn.load(tmp_path / "run").directory == tmp_path / "run" / "checkpoint"


def test_what_is_not_a_checkpoint_is_named(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json is missing .*a training run's folder"):
        aiayn.load(tmp_path / "empty")
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.csv").write_text("step,loss\n")
    with pytest.raises(ValueError, match=f"no checkpoint at {run}: the training run holds none"):
        aiayn.load(run)
    with pytest.raises(ValueError, match="not a folder"):
        aiayn.load(tmp_path / "nope")
    aiayn.save(tiny_model("gpt2-small", vocab_size=27), tmp_path / "alone")
    with pytest.raises(ValueError, match="no tokenizer.json .*aiayn.load_model"):
        aiayn.load(tmp_path / "alone")
    assert aiayn.load_model(tmp_path / "alone").config.vocab_size == 27
