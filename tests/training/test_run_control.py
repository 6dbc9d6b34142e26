"""What a run does with its folder: refuses to mix runs, resumes only what exists, says when a
run is complete, reports the final model's figures, keeps snapshots from the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.checkpoint import RunDir
from aiayn.cli import main
from aiayn.config.run import DataConfig, TrainConfig
from aiayn.training.config import load_run_config
from aiayn.training.lm import train_lm
from aiayn.training.policy import snapshot_steps

TOML = """
[model]
preset = "gpt2-small"
n_layers = 1
d_model = 32
attention.n_heads = 4
ffn.d_ff = 64
max_len = 16
dropout = 0.0

[data]
text = "corpus.txt"

[train]
max_steps = 7
batch_size = 4
block_size = 16
warmup_steps = 2
eval_interval = 3
eval_batches = 2
checkpoint_interval = 3
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "corpus.txt").write_text("All the world's a stage, and all the men players.\n" * 20)
    (tmp_path / "run.toml").write_text(TOML)
    return tmp_path


def cli(root: Path, *extra: str) -> int:
    return main(
        ["train", str(root / "run.toml"), "--out", str(root / "run"), "--data", str(root), *extra]
    )


def test_resume_with_nothing_to_resume_is_an_error(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(root, "--resume") == 2
    err = capsys.readouterr().err
    assert "nothing to resume" in err and "start without --resume" in err


def test_a_run_killed_before_its_first_checkpoint_points_to_overwrite(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed before its first checkpoint, a run leaves only its log: --resume cannot continue
    it, and a plain start refuses the folder, so the error must name the way out."""
    (root / "run").mkdir()
    (root / "run" / "log.csv").write_text("step,loss,lr,val_loss,tokens_per_s,val_ppl\n1,4.2,,,,\n")
    assert cli(root, "--resume") == 2
    assert "--overwrite" in capsys.readouterr().err
    assert cli(root) == 2
    assert cli(root, "--overwrite") == 0


def test_a_second_run_into_the_same_folder_needs_overwrite(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(root) == 0
    log = (root / "run" / "log.csv").read_text()
    assert cli(root) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (root / "run" / "log.csv").read_text() == log  # untouched
    (root / "run" / "notes.txt").write_text("mine")
    assert cli(root, "--overwrite") == 0
    assert len((root / "run" / "log.csv").read_text().splitlines()) == 8  # header + 7, once
    assert (root / "run" / "notes.txt").read_text() == "mine"  # only the run's files go


def test_resuming_a_finished_run_says_so_with_its_figures(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(root) == 0
    first = capsys.readouterr().out
    assert cli(root, "--resume") == 0
    out = capsys.readouterr().out
    assert "already complete: step 7 of 7" in out
    val = first.split("validation loss ")[1].split()[0]
    assert f"validation loss {val}" in out and "nan" not in out


def test_resuming_with_another_model_is_an_error_and_more_steps_are_not(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(root, "--set", "train.max_steps=3") == 0
    # [model] changed: --resume used to go on silently with the checkpoint's model.
    assert cli(root, "--resume", "--set", "train.max_steps=6", "model.n_layers=3") == 2
    err = capsys.readouterr().err
    assert "n_layers=3 (the checkpoint has 1)" in err and "--overwrite" in err
    # More positions: resuming used to go on with the checkpoint's 16 without a word.
    assert cli(root, "--resume", "--set", "train.max_steps=6", "model.max_len=64") == 2
    assert "max_len=64 (the checkpoint has 16)" in capsys.readouterr().err
    assert cli(root, "--resume", "--set", "train.max_steps=6") == 0  # [train] may change


def test_a_validation_split_too_small_is_refused_before_training(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to fail only at the first evaluation, eval_interval steps in, with no checkpoint
    # left, so that the rerun needed --overwrite.
    assert cli(root, "--set", "data.train_fraction=0.99") == 2
    assert "the val split has" in capsys.readouterr().err
    assert cli(root) == 0  # the folder holds no run: a plain start is fine
    (root / "bad.toml").write_bytes(TOML.encode().replace(b"corpus", b"c\xffrpus"))
    assert main(["train", str(root / "bad.toml"), "--out", str(root / "r2")]) == 2
    assert f"config file {root / 'bad.toml'} is not UTF-8 text" in capsys.readouterr().err


def test_final_figures_are_the_final_models(root: Path) -> None:
    run = load_run_config(root / "run.toml")
    result = train_lm(run, root / "run", root, progress=False)
    assert result.history[-1]["step"] == 7 and "val_loss" in result.history[-1]
    assert result.val_loss == result.history[-1]["val_loss"]
    # Stopped early (a budget, or a planned stop): evaluated where it stopped.
    part = train_lm(run, root / "part", root, stop_after=5, progress=False)
    assert part.step == 5 and part.val_loss == part.history[-1]["val_loss"]
    assert RunDir(root / "part").load()[1].step == 5


@pytest.mark.parametrize(
    ("steps", "keep", "fraction", "expected"),
    [
        (1000, 5, 0.1, {1000, 980, 960, 940, 920}),
        (3000, 5, 0.1, {3000, 2940, 2880, 2820, 2760}),
        (10, 5, 0.1, {10, 9, 8, 7, 6}),
        (100, 0, 0.1, set()),
        (100, 2, 0.2, {100, 90}),
    ],
)
def test_snapshots_come_from_the_end_of_the_run(
    steps: int, keep: int, fraction: float, expected: set[int]
) -> None:
    tc = TrainConfig(max_steps=steps, keep_snapshots=keep, snapshot_fraction=fraction)
    assert snapshot_steps(tc) == expected


def test_bad_train_settings_are_named() -> None:
    with pytest.raises(ValueError, match="on_nonfinite='maybe'"):
        TrainConfig(on_nonfinite="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="snapshot_fraction=0"):
        TrainConfig(snapshot_fraction=0)
    with pytest.raises(ValueError, match="max_minutes=-1"):
        TrainConfig(max_minutes=-1)
    # Wrong types are named, not a TypeError from a comparison (or, for weight_decay, from
    # inside the optimizer after training had started).
    for field, value, expected in [
        ("lr", "fast", "a number"),
        ("weight_decay", "abc", "a number"),
        ("keep_snapshots", "abc", "an integer"),
        ("compile", "yes", "true or false"),
    ]:
        with pytest.raises(
            ValueError, match=f"TrainConfig.{field}='{value}' is invalid: expected {expected}"
        ):
            TrainConfig(**{field: value})  # type: ignore[arg-type]


def test_data_settings_and_tables_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="DataConfig.tokenizer='word' is invalid"):
        DataConfig(tokenizer="word")  # type: ignore[arg-type]
    # One side of a pair of own files alone trained on Multi30k without a word.
    with pytest.raises(ValueError, match="train_source is set but train_target is not"):
        DataConfig(train_source="small/train.de")
    with pytest.raises(ValueError, match="valid_target is set but valid_source is not"):
        DataConfig(valid_target="small/valid.en")
    cfg = tmp_path / "run.toml"
    cfg.write_text("train = 5\n")
    with pytest.raises(
        ValueError, match=r"\[train\] in .*run.toml must be a table of settings, got 5"
    ):
        load_run_config(cfg)


def test_a_resumed_run_keeps_the_kernels_its_start_chose(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The oneDNN/MKL choice is measured once, at the start; a resume on a host (or an hour)
    where the measurement would go the other way must not change the run's numerics."""
    import aiayn.nn.cpu_kernels as cpu_kernels

    run = load_run_config(root / "run.toml")
    probes: list[int] = []

    def fast_onednn(*args: int, **kw: int) -> float:
        probes.append(1)
        return 2.0

    monkeypatch.setattr(cpu_kernels, "onednn_speedup", fast_onednn)
    train_lm(run, root / "run", root, stop_after=3, progress=False)
    assert probes == [1]
    _, state = RunDir(root / "run").load()
    assert state.kernels == {"linear": "onednn"}

    def probe_must_not_run(*args: int, **kw: int) -> float:
        raise AssertionError("a resumed run measured the kernels again")

    monkeypatch.setattr(cpu_kernels, "onednn_speedup", probe_must_not_run)
    used: list[bool] = []
    real_use = cpu_kernels.for_training
    monkeypatch.setattr(
        cpu_kernels, "for_training", lambda m, k: used.append(k == "onednn") or real_use(m, k)
    )
    train_lm(run, root / "run", root, resume=True, progress=False)
    assert used == [True]
    _, state = RunDir(root / "run").load()
    assert state.step == 7 and state.kernels == {"linear": "onednn"}


def test_linear_kernel_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="linear_kernel='blas'"):
        TrainConfig(linear_kernel="blas")  # type: ignore[arg-type]
