"""LM training: loss goes down, resume reproduces the uninterrupted run, schedules, configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import RunDir, load
from aiayn.nn import matmul_attention
from aiayn.training.config import load_run_config
from aiayn.training.lm import train_lm
from aiayn.training.optim import build_adamw
from aiayn.training.schedule import cosine_schedule, paper_schedule
from tests.conftest import LM_TEXT, LM_TOML


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "corpus.txt").write_text(LM_TEXT)
    (tmp_path / "run.toml").write_text(LM_TOML)
    return tmp_path, tmp_path / "run.toml"


def test_resume_reproduces_uninterrupted_run(setup: tuple[Path, Path]) -> None:
    root, cfg_path = setup
    run = load_run_config(cfg_path)
    full = train_lm(run, root / "full", root, progress=False)
    train_lm(run, root / "split", root, stop_after=4, progress=False)  # "killed" after step 4
    resumed = train_lm(run, root / "split", root, resume=True, progress=False)
    losses = [h["loss"] for h in full.history]
    assert len(losses) == 8 and losses[-1] < losses[0]
    # the two runs each measure their linear kernel (MKL or oneDNN), whose fp32 su
    # order: rounding (2^-23) through 8 steps; a resumed run is otherwise exact (test_faults)
    assert [h["loss"] for h in resumed.history] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    assert resumed.val_loss == pytest.approx(full.val_loss, rel=1e-5)  # (as above)
    bundle, state = RunDir(root / "split").load()
    assert state.step == 8 and bundle.run["train"]["max_steps"] == 8
    tok = bundle.tokenizer
    assert tok.decode(tok.encode("To be")) == "To be"
    log = (root / "split" / "log.csv").read_text().splitlines()
    assert log[0].startswith("step,loss") and len(log) == 9


def test_config_errors(setup: tuple[Path, Path]) -> None:
    root, cfg_path = setup
    with pytest.raises(ValueError, match="unknown key"):
        load_run_config(cfg_path, {"train.learning_rate": 1.0})
    with pytest.raises(ValueError, match="max_steps=0"):
        load_run_config(cfg_path, {"train.max_steps": 0})
    with pytest.raises(ValueError, match="not valid TOML"):
        (root / "bad.toml").write_text("[model\n")
        load_run_config(root / "bad.toml")
    run = load_run_config(cfg_path, {"model.n_layers": 1, "train.max_steps": 3})
    assert run.model.n_layers == 1 and run.train.max_steps == 3
    (root / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty"):
        train_lm(
            load_run_config(cfg_path, {"data.text": "empty.txt"}), root / "o", root, progress=False
        )


def test_schedules() -> None:
    # Eq. (3): peak at step = warmup, value d^-0.5 * warmup^-0.5.
    peak = paper_schedule(4000, d_model=512, warmup=4000)
    assert peak == pytest.approx(512**-0.5 * 4000**-0.5)
    assert paper_schedule(2000, d_model=512, warmup=4000) == pytest.approx(peak / 2)
    assert paper_schedule(16000, d_model=512, warmup=4000) == pytest.approx(peak / 2)
    assert cosine_schedule(0, lr=1.0, min_lr=0.1, warmup=10, total=110) == pytest.approx(0.1)
    assert cosine_schedule(9, lr=1.0, min_lr=0.1, warmup=10, total=110) == pytest.approx(1.0)
    assert cosine_schedule(60, lr=1.0, min_lr=0.1, warmup=10, total=110) == pytest.approx(0.55)
    assert cosine_schedule(200, lr=1.0, min_lr=0.1, warmup=10, total=110) == 0.1


def test_weight_decay_only_on_matrices() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_adamw(model, lr=1e-3, weight_decay=0.1)
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    assert decayed == {id(model[0].weight)}
    assert opt.param_groups[1]["weight_decay"] == 0.0


def test_trains_a_mixture_of_experts(setup: tuple[Path, Path]) -> None:
    root, cfg_path = setup
    run = load_run_config(
        cfg_path, {"model.ffn.n_experts": 4, "model.ffn.top_k": 2, "train.max_steps": 6}
    )
    out = train_lm(run, root / "moe", root, progress=False)
    losses = [h["loss"] for h in out.history]
    assert losses[-1] < losses[0]
    assert load(root / "moe" / "checkpoint").model.config.ffn.n_experts == 4


@pytest.mark.parametrize("schedule", ["cosine", "paper"])
def test_the_language_model_follows_the_configured_schedule(
    setup: tuple[Path, Path], schedule: str
) -> None:
    root, cfg_path = setup
    run = load_run_config(cfg_path, {"train.schedule": schedule, "train.lr": 2.0})
    result = train_lm(run, root / schedule, root, progress=False)
    tc = run.train
    expected = [
        paper_schedule(step + 1, d_model=32, warmup=tc.warmup_steps, factor=tc.lr)
        if schedule == "paper"
        else cosine_schedule(
            step, lr=tc.lr, min_lr=tc.min_lr, warmup=tc.warmup_steps, total=tc.max_steps
        )
        for step in range(tc.max_steps)
    ]
    assert [h["lr"] for h in result.history] == pytest.approx(expected)


@pytest.mark.slow
def test_compiled_training_matches_eager(setup: tuple[Path, Path]) -> None:
    """``train.compile = true`` trains the same model as eager mode (the causal matmul
    attention, the fused cross-entropy and the checkpoint all go through torch.compile)."""
    root, cfg_path = setup
    settings = {"model.dropout": 0.0, "train.max_steps": 4, "train.checkpoint_interval": 4}
    matmul_attention._causal_bias.clear()  # as in a fresh process: compiled first
    run = load_run_config(cfg_path, {**settings, "train.compile": True})
    compiled = train_lm(run, root / "compiled", root, progress=False)
    eager = train_lm(load_run_config(cfg_path, settings), root / "eager", root, progress=False)
    losses = [h["loss"] for h in eager.history]
    # inductor fuses and reorders fp32 sums: rounding, grown through 4 Adam steps (Adam divides
    # by sqrt(v), so a tiny gradient difference moves a near-zero moment's update by more)
    assert [h["loss"] for h in compiled.history] == pytest.approx(losses, rel=1e-4)
    a = load(root / "eager" / "checkpoint").model.state_dict()
    b = load(root / "compiled" / "checkpoint").model.state_dict()
    assert a.keys() == b.keys()  # no torch.compile wrapper prefix in the saved names
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-3, atol=1e-5, msg=name)  # (as above)
