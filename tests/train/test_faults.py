"""Fault injection: whatever stops a run, nothing is lost.

Each test trains a tiny character-level language model (dropout on, so that the RNG state
matters) and compares against one uninterrupted run: after SIGKILL at random instants or at
every file-system step of a checkpoint commit, after SIGTERM and Ctrl-C, the resumed run ends
with the same weights bit for bit and log.csv holds every step exactly once.  A full disk, a
damaged checkpoint file and a NaN loss each give an error that names what is wrong, and the
previous checkpoint stays usable.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aiayn.checkpoint import RunDir
from aiayn.checkpoint.atomic import set_fault_hook
from aiayn.cli import main
from aiayn.train.config import load_run_config
from aiayn.train.lm import LMTask, train_lm
from aiayn.train.loop import NonFiniteLoss

DRIVER = Path(__file__).with_name("fault_driver.py")
STEPS = 240
TOML = f"""
[model]
preset = "gpt2-small"
n_layers = 2
d_model = 48
n_heads = 4
d_ff = 96
max_len = 32
dropout = 0.1

[data]
text = "corpus.txt"

[train]
max_steps = {STEPS}
batch_size = 32
block_size = 32
lr = 3e-3
warmup_steps = 4
eval_interval = 60
eval_batches = 2
checkpoint_interval = 3
keep_snapshots = 2
threads = 1
linear_kernel = "mkl"  # the reference and the resumed runs must take the same kernels
"""
COMMIT_STEPS = [
    "files-written",
    "files-synced",
    "renamed",
    "pointer-written",
    "pointer-switched",
    "old-removed",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """The data folder, the config, and the weights of one uninterrupted run."""
    root = tmp_path_factory.mktemp("faults")
    (root / "corpus.txt").write_text(
        "Now is the winter of our discontent made glorious summer by this sun of York.\n" * 30
    )
    (root / "run.toml").write_text(TOML)
    run_cli(root, "reference", [])
    return root, final_weights(root / "reference")


def wait_ready(proc: subprocess.Popen[str]) -> None:
    """Read the child's stdout up to the driver's "ready" (the loop may print notes first)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "ready":
            return
    raise AssertionError("the training process ended before its first step")


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path.cwd())}


def train_args(root: Path, out: str, extra: list[str]) -> list[str]:
    return [str(root / "run.toml"), "--out", str(root / out), "--data", str(root), *extra]


def run_cli(root: Path, out: str, extra: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DRIVER), "--", *train_args(root, out, extra)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The final checkpoint's weights, read from model.safetensors or from its shards."""
    if (run / "checkpoint" / "model.safetensors").is_file():
        return load_file(str(run / "checkpoint" / "model.safetensors"))
    bundle, _ = RunDir(run).load()
    return {k: v for k, v in bundle.model.state_dict().items() if k in reference_names(run)}


def reference_names(run: Path) -> set[str]:
    return set(load_file(str(run.parent / "reference" / "checkpoint" / "model.safetensors")))


def assert_same_run(root: Path, out: str, reference: dict[str, torch.Tensor]) -> None:
    weights = final_weights(root / out)
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), f"{name} differs from the uninterrupted run"
    steps = [
        int(line.split(",")[0]) for line in (root / out / "log.csv").read_text().splitlines()[1:]
    ]
    assert steps == list(range(1, STEPS + 1)), "log.csv must hold every step exactly once"
    rd = RunDir(root / out)
    assert [p.name for p in rd.checkpoints.iterdir()] == [f"step_{STEPS:09d}"]
    assert not [p for p in (root / out).rglob(".*tmp*")], "temporary leftovers"
    assert [p.name for p in rd.snapshot_dirs()] == ["step_000000228", "step_000000240"]


def finish(root: Path, out: str) -> None:
    done = run_cli(root, out, ["--resume"])
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("fmt", ["full", "sharded"])
@pytest.mark.parametrize("commit_step", COMMIT_STEPS)
def test_sigkill_at_every_step_of_a_checkpoint_commit(
    setup: tuple[Path, dict[str, torch.Tensor]], commit_step: str, fmt: str
) -> None:
    """Killed at each file-system step of the third commit, full or sharded
    (torch.distributed.checkpoint's files, aiayn/checkpoint/sharded.py), the run resumes and
    ends bit for bit where the uninterrupted run with full checkpoints does."""
    root, reference = setup
    out = f"kill-{fmt}-{commit_step}"
    cmd = [sys.executable, str(DRIVER), "--kill-at", f"{commit_step}:3", "--"]
    extra = ["--set", f"train.checkpoint_format={fmt}"]
    killed = subprocess.run(
        [*cmd, *train_args(root, out, extra)], env=env(), capture_output=True, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL
    rd = RunDir(root / out)
    rd.recover()
    assert rd.latest() is not None  # never an instant without a complete checkpoint
    done = run_cli(root, out, [*extra, "--resume"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert (rd.latest() / "dcp").is_dir() == (fmt == "sharded")  # type: ignore[operator]
    assert_same_run(root, out, reference)


def test_sigkill_at_random_instants(setup: tuple[Path, dict[str, torch.Tensor]]) -> None:
    root, reference = setup
    out, rng, kills = "random", random.Random(7), 0
    cmd = [sys.executable, str(DRIVER), "--kill-at", "old-removed:1", "--"]
    first = subprocess.run([*cmd, *train_args(root, out, [])], env=env(), capture_output=True)
    assert first.returncode == -signal.SIGKILL  # killed just after its first checkpoint
    while kills < 20:
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), "--", *train_args(root, out, ["--resume"])],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        wait_ready(proc)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        code = proc.wait(timeout=60)
        assert code in (0, -signal.SIGKILL)
        if code == 0:
            break  # it finished before the kill came
        kills += 1
    assert kills == 20, f"the run finished after only {kills} kills: make it longer"
    finish(root, out)
    assert_same_run(root, out, reference)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_checkpoint_and_exit(
    setup: tuple[Path, dict[str, torch.Tensor]], sig: signal.Signals, code: int
) -> None:
    root, reference = setup
    out = f"signal-{sig.name}"
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), "--", *train_args(root, out, [])],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_ready(proc)
    time.sleep(0.3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-2000:]
    assert f"{sig.name} received: stopped after step" in err
    stopped_at = int(err.split("stopped after step ")[1].split()[0])
    assert 0 < stopped_at < STEPS
    _, state = RunDir(root / out).load()
    assert state.step == stopped_at  # the checkpoint is at the current step, not an older one
    finish(root, out)
    assert_same_run(root, out, reference)


def test_disk_full_keeps_the_previous_checkpoint(
    setup: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    root, reference = setup
    run = load_run_config(root / "run.toml")
    calls = {"n": 0}

    def full_disk(step: str) -> None:
        if step == "files-written":
            calls["n"] += 1
            if calls["n"] == 2:  # the second checkpoint's files
                raise OSError(errno.ENOSPC, "No space left on device")

    set_fault_hook(full_disk)
    try:
        with pytest.raises(OSError, match=r"no space left on the device while writing .*step_"):
            train_lm(run, root / "full-disk", root, progress=False)
    finally:
        set_fault_hook(None)
    rd = RunDir(root / "full-disk")
    bundle, state = rd.load()
    assert state.step == 3 and bundle.model is not None  # the first checkpoint, intact
    assert not [p for p in (root / "full-disk").rglob(".*tmp*")]
    train_lm(run, root / "full-disk", root, resume=True, progress=False)
    assert_same_run(root, "full-disk", reference)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("model.safetensors", "model.safetensors is truncated"),
        ("train_state.pt", "train_state.pt is truncated"),
        ("config.json", "config.json is truncated"),
        ("train_state.pt:no-manifest", "corrupt training state"),
        ("config.json:no-manifest", "corrupt model config"),
    ],
)
def test_damaged_checkpoint_files_are_named_and_nothing_restarts(
    setup: tuple[Path, dict[str, torch.Tensor]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: str,
    message: str,
) -> None:
    root, _ = setup
    run = load_run_config(root / "run.toml", {"train.max_steps": 6})
    train_lm(run, tmp_path / "run", root, stop_after=3, progress=False)
    folder = RunDir(tmp_path / "run").latest()
    assert folder is not None
    name, _, how = damage.partition(":")
    if how == "no-manifest":
        (folder / "manifest.json").unlink()
    target = folder / name
    target.write_bytes(target.read_bytes()[: max(1, target.stat().st_size // 3)])
    log_before = (tmp_path / "run" / "log.csv").read_text()
    code = main(
        [
            "train",
            str(root / "run.toml"),
            "--out",
            str(tmp_path / "run"),
            "--data",
            str(root),
            "--resume",
            "--set",
            "train.max_steps=6",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert str(folder) in err or name in err
    assert (tmp_path / "run" / "log.csv").read_text() == log_before  # no fresh start


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_a_nan_loss_stops_or_skips_naming_the_step(
    setup: tuple[Path, dict[str, torch.Tensor]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    policy: str,
) -> None:
    root, _ = setup
    run = load_run_config(root / "run.toml", {"train.max_steps": 8, "train.on_nonfinite": policy})
    original, calls = LMTask.loss, {"n": 0}

    def poisoned(self: LMTask, model: torch.nn.Module, batch: object, aux: list) -> object:  # type: ignore[type-arg]
        loss, n = original(self, model, batch, aux)  # type: ignore[arg-type]
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == 5 else loss), n

    monkeypatch.setattr(LMTask, "loss", poisoned)
    out = tmp_path / policy
    if policy == "stop":
        with pytest.raises(NonFiniteLoss, match="became nan at step 5.*step_000000003"):
            train_lm(run, out, root, progress=False)
        _, state = RunDir(out).load()
        assert state.step == 3  # the last good checkpoint stays
        assert all(torch.isfinite(t).all() for t in final_weights(out).values())
    else:
        result = train_lm(run, out, root, progress=False)
        assert result.skipped_steps == [5] and result.step == 8
        assert all(torch.isfinite(t).all() for t in final_weights(out).values())
