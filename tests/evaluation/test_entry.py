"""``aiayn.evaluate``, the library call behind ``aiayn evaluate``: a checkpoint in, its scores
out, the same numbers the command prints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.cli import main
from aiayn.data.lm_data import TokenStream
from aiayn.errors import UserError
from aiayn.evaluation.perplexity import evaluate_lm
from tests.conftest import LM_TEXT, LM_TOML


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lm")
    (root / "corpus.txt").write_text(LM_TEXT)
    (root / "run.toml").write_text(LM_TOML)
    aiayn.train(root / "run.toml", root / "run", data=root, overrides={"train.max_steps": 3})
    return root


def test_a_language_model_is_scored_on_its_held_out_text(lm_run: Path) -> None:
    result = aiayn.evaluate(lm_run / "run", data=lm_run, batches=2, batch_size=2, block=8)
    bundle = aiayn.load(lm_run / "run")
    stream = TokenStream.from_file(lm_run / "corpus.txt", bundle.tokenizer, train_fraction=0.9)
    loss = evaluate_lm(bundle.model, stream, batches=2, batch_size=2, block=8)  # type: ignore[arg-type]
    assert result.task == "lm" and result.scores["loss"] == pytest.approx(loss, rel=1e-6)
    assert result.scores["perplexity"] == pytest.approx(math.exp(loss), rel=1e-6)
    assert result.scores["bits_per_character"] == pytest.approx(loss / math.log(2), rel=1e-6)
    assert torch.isfinite(torch.tensor(loss))


def test_the_command_prints_what_the_call_returns(
    lm_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--data", str(lm_run), "--batches", "2", "--batch-size", "2", "--block", "8"]
    assert main(["evaluate", "--checkpoint", str(lm_run / "run"), *args]) == 0
    printed = capsys.readouterr().out
    result = aiayn.evaluate(lm_run / "run", data=lm_run, batches=2, batch_size=2, block=8)
    assert f"perplexity         {result.scores['perplexity']:.3f}" in printed


def test_a_bad_limit_and_a_missing_data_folder_are_named(lm_run: Path) -> None:
    with pytest.raises(UserError, match="limit=0: score at least 1"):
        aiayn.evaluate(lm_run / "run", limit=0)
    with pytest.raises(UserError, match="data folder .*nowhere does not exist"):
        aiayn.evaluate(lm_run / "run", data=lm_run / "nowhere", text="missing.txt")
