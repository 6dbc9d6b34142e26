"""Fault injection: whatever stops a run, nothing is lost.

Each test trains a tiny character-level language model (dropout on, so that the RNG state
matters) and compares against one uninterrupted run: after SIGKILL at points drawn in advance
(a training step, or a named file-system step of a checkpoint commit -- never an instant that
depends on the host's speed), at every file-system step of a commit, in the middle of a DCP
shard, while a snapshot folder is replaced, after SIGTERM and Ctrl-C, the resumed run ends
with the same weights bit for bit and log.csv holds every step exactly once.  The resumed
``aiayn train --resume`` repairs the folder itself; until then, ``--checkpoint RUN/checkpoint``
loads a complete checkpoint.  A full disk, a damaged checkpoint file and a NaN loss each give
an error that names what is wrong, and the previous checkpoint stays usable.
"""

from __future__ import annotations

import contextlib
import errno
import io
import multiprocessing
import os
import random
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from aiayn import atomic
from aiayn.atomic import set_fault_hook
from aiayn.checkpoint import RunDir, load
from aiayn.checkpoint.run_dir import step_dir_name
from aiayn.cli import main
from aiayn.errors import NonFiniteLoss
from aiayn.training.config import load_run_config
from aiayn.training.lm import LMTask, train_lm
from tests.training import fault_driver

DRIVER = Path(__file__).with_name("fault_driver.py")
STEPS = 36  # every kill point is drawn in advance: no need for a long run
TOML = f"""
[model]
preset = "gpt2-small"
n_layers = 2
d_model = 48
attention.n_heads = 4
ffn.d_ff = 96
max_len = 32
dropout = 0.1

[data]
text = "corpus.txt"

[train]
max_steps = {STEPS}
batch_size = 16
block_size = 32
lr = 3e-3
warmup_steps = 4
eval_interval = 24
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
CHILD_TIMEOUT_S = 120  # a hang guard only: every run here takes seconds
TMP_LEFTOVER = "removed the unfinished .step_000000009.tmp-"
# Killed at a point of the third commit (step 9; checkpoints every 3 steps): the step that
# RUN/checkpoint holds at the kill, and the repairs the resumed `aiayn train` must report
# (the beginning of each note, in order).
AT_THE_THIRD_COMMIT: dict[str, tuple[int, list[str]]] = {
    "mid-shard": (6, [TMP_LEFTOVER]),
    "files-written": (6, [TMP_LEFTOVER]),
    "files-synced": (6, [TMP_LEFTOVER]),
    "renamed": (
        6,
        ["pointed checkpoint at step_000000009", "removed the older checkpoint step_000000006"],
    ),
    "pointer-written": (
        6,
        [
            "removed the unfinished .checkpoint.tmp-link",
            "pointed checkpoint at step_000000009",
            "removed the older checkpoint step_000000006",
        ],
    ),
    "pointer-switched": (9, ["removed the older checkpoint step_000000006"]),
    "old-removed": (9, []),
}
SNAPSHOTS = ["step_000000034", "step_000000036"]  # keep_snapshots = 2 of the last 10%
RANDOM_SEED, RANDOM_KILLS = 1, 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """The data folder, the config, and the weights of one uninterrupted run."""
    root = tmp_path_factory.mktemp("faults")
    (root / "corpus.txt").write_text(
        "Now is the winter of our discontent made glorious summer by this sun of York.\n" * 30
    )
    (root / "run.toml").write_text(TOML)
    train_here(root, "reference", [])
    return root, final_weights(root / "reference")


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Training processes a test starts with Popen: whatever the test's outcome, none is left
    running after it (killed, then waited for)."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def wait_ready(proc: subprocess.Popen[str], timeout_s: float = CHILD_TIMEOUT_S) -> None:
    """Read the child's stdout up to the driver's "ready" (the loop may print notes first);
    fail, rather than block, if it has not come within ``timeout_s`` (a hang guard)."""
    assert proc.stdout is not None
    fd, seen = proc.stdout.fileno(), b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while "ready" not in seen.decode(errors="replace").splitlines():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no 'ready' from the training process in {timeout_s} s")
            if not selector.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                raise AssertionError("the training process ended before its first step")
            seen += chunk


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path.cwd())}


def train_args(root: Path, out: str, extra: list[str]) -> list[str]:
    return [str(root / "run.toml"), "--out", str(root / out), "--data", str(root), *extra]


# Killed runs are children forked from a server that imported torch and aiayn once (not new
# interpreters): each costs its training, not a second or more of imports.
FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["tests.training.fault_driver"])


@dataclass
class Child:
    returncode: int
    stderr: str  # with its stdout


def run_driver(root: Path, out: str, extra: list[str], driver: Sequence[str] = ()) -> Child:
    """``aiayn train`` in a child process, with the driver's options (``--kill-at``...)."""
    log = root / f"{out}.{len(list(root.glob(f'{out}.*.log')))}.log"
    argv = [*driver, "--", *train_args(root, out, extra)]
    child = FORKS.Process(target=fault_driver.run_child, args=(argv, str(log)))
    child.start()
    child.join(CHILD_TIMEOUT_S)
    if child.exitcode is None:  # a hang guard
        child.kill()
        child.join()
        raise AssertionError(f"the training child did not end in {CHILD_TIMEOUT_S} s")
    return Child(child.exitcode, log.read_text())


def train_here(root: Path, out: str, extra: Sequence[str]) -> str:
    """``aiayn train`` in this process, as the CLI runs it; its stderr.  The runs that are
    killed are child processes; the uninterrupted run and every resumption to the end run
    here, and take the same kernels on one thread (``train.threads``), so they are bit for bit
    the runs a child makes, without a child's start-up."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train", *train_args(root, out, list(extra))])
    assert code == 0, err.getvalue()[-2000:]
    return err.getvalue()


def killed_at(root: Path, out: str, point: str, extra: list[str], more: Sequence[str] = ()) -> str:
    """Run until the driver kills itself at ``point``; fail if it was not killed there.
    Returns the child's stderr."""
    done = run_driver(root, out, extra, ["--kill-at", point, *more])
    assert done.returncode == -signal.SIGKILL, (
        f"expected a SIGKILL at {point}, got exit code {done.returncode}: {done.stderr[-2000:]}"
    )
    return done.stderr


def repairs(run: Path, stderr: str) -> list[str]:
    """The notes of the resumed run's repair of its folder (aiayn/training/loop.py)."""
    prefix = f"{run}: "
    return [line[len(prefix) :] for line in stderr.splitlines() if line.startswith(prefix)]


def assert_repairs(run: Path, stderr: str, expected: list[str]) -> None:
    notes = repairs(run, stderr)
    assert len(notes) == len(expected) and all(
        note.startswith(want) for note, want in zip(notes, expected, strict=True)
    ), f"the resumed run's repairs: {notes}, expected {expected}"


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    """The final checkpoint's weights, read from model.safetensors or from its shards."""
    if (run / "checkpoint" / "model.safetensors").is_file():
        return load_file(str(run / "checkpoint" / "model.safetensors"))
    bundle, _ = RunDir(run).load()
    return {k: v for k, v in bundle.model.state_dict().items() if k in reference_names(run)}


def reference_names(run: Path) -> set[str]:
    return set(load_file(str(run.parent / "reference" / "checkpoint" / "model.safetensors")))


def assert_same_weights(weights: dict[str, torch.Tensor], reference: dict[str, Any]) -> None:
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(weights[name], tensor), f"{name} differs from the uninterrupted run"


def assert_same_run(root: Path, out: str, reference: dict[str, torch.Tensor]) -> None:
    assert_same_weights(final_weights(root / out), reference)
    steps = [
        int(line.split(",")[0]) for line in (root / out / "log.csv").read_text().splitlines()[1:]
    ]
    assert steps == list(range(1, STEPS + 1)), "log.csv must hold every step exactly once"
    rd = RunDir(root / out)
    assert [p.name for p in rd.checkpoints.iterdir()] == [f"step_{STEPS:09d}"]
    assert not [p for p in (root / out).rglob(".*tmp*")], "temporary leftovers"
    assert not [p for p in (root / out).rglob(f".*{atomic.OLD_MARK}*")], "replaced leftovers"
    assert [p.name for p in rd.snapshot_dirs()] == SNAPSHOTS


def finish(root: Path, out: str, extra: Sequence[str] = ()) -> str:
    """Resume the run to its end with the CLI (in this process); its stderr."""
    return train_here(root, out, [*extra, "--resume"])


def assert_checkpoint_loads(
    root: Path, out: str, step: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """What ``--checkpoint RUN/checkpoint`` loads, before anything repairs the folder: the
    complete checkpoint of ``step``, which `generate` and `evaluate` use."""
    pointer = root / out / "checkpoint"
    assert Path(os.path.realpath(pointer)).name == step_dir_name(step)
    capsys.readouterr()
    common = ["--checkpoint", str(pointer), "--device", "cpu"]
    code = main(["generate", *common, "--prompt", "Now", "--max-new-tokens", "4", "--seed", "0"])
    generated = capsys.readouterr()
    assert code == 0 and generated.out.startswith("Now"), generated.err
    assert len(generated.out) > len("Now\n"), generated.out
    code = main(["evaluate", *common, "--data", str(root), "--batches", "1", "--batch-size", "2"])
    evaluated = capsys.readouterr()
    assert code == 0 and "validation loss" in evaluated.out, evaluated.err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fmt", "point"),
    [*[(fmt, p) for fmt in ("full", "sharded") for p in COMMIT_STEPS], ("sharded", "mid-shard")],
)
def test_sigkill_at_every_step_of_a_checkpoint_commit(
    setup: tuple[Path, dict[str, torch.Tensor]],
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    point: str,
) -> None:
    """Killed at each file-system step of the third commit, full or sharded
    (torch.distributed.checkpoint's files, aiayn/checkpoint/sharded.py), or in the middle of
    writing its DCP shard: RUN/checkpoint loads a complete checkpoint at the kill, and the
    resumed CLI repairs the folder and ends bit for bit where the uninterrupted run with full
    checkpoints does."""
    root, reference = setup
    out, (step, expected_repairs) = f"kill-{fmt}-{point}", AT_THE_THIRD_COMMIT[point]
    extra = ["--set", f"train.checkpoint_format={fmt}"]
    killed_at(root, out, f"{point}:3", extra)
    rd = RunDir(root / out)
    if point == "mid-shard":  # the shard file is there, half written, and no .metadata
        (tmp,) = rd.checkpoints.glob(".step_000000009.tmp-*")
        shards = [p for p in (tmp / "dcp").iterdir() if p.suffix == ".distcp"]
        assert shards and all(p.stat().st_size > 0 for p in shards)
        assert not (tmp / "dcp" / ".metadata").exists()
    assert_checkpoint_loads(root, out, step, capsys)
    err = finish(root, out, extra)
    assert_repairs(root / out, err, expected_repairs)
    assert (rd.latest() / "dcp").is_dir() == (fmt == "sharded")  # type: ignore[operator]
    assert_same_run(root, out, reference)


def kill_schedule(seed: int, kills: int) -> list[str]:
    """Kill points drawn in advance: the K-th step of a process, or a named file-system step
    of its N-th commit.  Each run advances at most 6 steps (checkpoints every 3), so every
    point is reached within the 36 steps; the first run dies after its first commit."""
    rng = random.Random(seed)
    points = []
    for i in range(kills):
        if rng.random() < 0.5:
            points.append(f"step:{rng.randint(4 if i == 0 else 1, 9)}")
        else:
            points.append(f"{rng.choice(COMMIT_STEPS)}:{rng.randint(2 if i == 0 else 1, 2)}")
    return points


@pytest.mark.slow
def test_sigkill_at_points_drawn_in_advance(setup: tuple[Path, dict[str, torch.Tensor]]) -> None:
    """Killed again and again, each time at a point drawn in advance (a seeded draw, not a
    timer): each kill leaves RUN/checkpoint loadable, and the run resumed by the CLI after the
    last one ends bit for bit where the uninterrupted run does."""
    root, reference = setup
    out = "random"
    schedule = kill_schedule(RANDOM_SEED, RANDOM_KILLS)
    assert {p.split(":")[0] == "step" for p in schedule} == {True, False}  # both kinds
    for i, point in enumerate(schedule):
        killed_at(root, out, point, [] if i == 0 else ["--resume"])
        load(root / out / "checkpoint")  # complete: every file's checksum matches
    finish(root, out)
    assert_same_run(root, out, reference)


@pytest.mark.slow
def test_sigkill_while_training_from_token_shards(
    setup: tuple[Path, dict[str, torch.Tensor]],
) -> None:
    """The same run from token shards (``aiayn preprocess`` of its text, read through mmap):
    killed at points drawn in advance (another draw), each time resumed, it ends bit for bit
    at the weights of the uninterrupted run from the plain file."""
    root, reference = setup
    shards = root / "shards"
    made = main(
        [
            "preprocess",
            str(root / "run.toml"),
            "--data",
            str(root),
            "--out",
            str(shards),
            "--workers",
            "1",
        ]
    )
    assert made == 0
    extra = ["--set", "data.shards=shards"]
    for i, point in enumerate(kill_schedule(RANDOM_SEED + 1, 4)):
        killed_at(root, "from-shards", point, extra if i == 0 else [*extra, "--resume"])
    finish(root, "from-shards", extra)
    assert_same_run(root, "from-shards", reference)


def exchange_works(folder: Path) -> bool:
    """Whether this system swaps two folders' names in one step (renameat2)."""
    a, b = folder / "a", folder / "b"
    a.mkdir()
    b.mkdir()
    return atomic.exchange(a, b)


@pytest.mark.slow
def test_sigkill_while_a_snapshot_folder_is_replaced(
    setup: tuple[Path, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    """A run resumed from before a snapshot it already wrote replaces that snapshot folder:
    killed just after the exchange (aiayn/atomic.py), then -- as on a system
    without renameat2(RENAME_EXCHANGE) -- just after the old folder was renamed aside, the
    resumed CLI repairs each state and ends bit for bit where the uninterrupted run does."""
    if not exchange_works(tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    root, reference = setup
    out, snapshot = "snapshot", SNAPSHOTS[0]
    snapshots = RunDir(root / out).snapshots
    # 1. Checkpoints at 3, 6, ... 33; the snapshot of step 34; killed in step 35.
    killed_at(root, out, "step:35", [])
    assert [p.name for p in snapshots.iterdir()] == [snapshot]
    # 2. Resumed from 33, killed once the new snapshot 34 took the name: the old one waits
    #    under the temporary name.
    killed_at(root, out, "exchanged:1", ["--resume"])
    (exchanged,) = snapshots.glob(f".{snapshot}.tmp-*")
    atomic.verify_manifest(snapshots / snapshot)
    # 3. Resumed from 33 again, without the exchange: killed with the old snapshot aside.
    err = killed_at(root, out, "old-moved-aside:1", ["--resume"], ["--no-exchange"])
    assert_repairs(root / out, err, [f"removed the unfinished {exchanged.name}"])
    assert not (snapshots / snapshot).exists()
    assert len(list(snapshots.glob(f".{snapshot}{atomic.OLD_MARK}*"))) == 1
    # 4. The resumed CLI puts the old snapshot back before it trains, then rewrites it.
    err = finish(root, out)
    assert_repairs(
        root / out,
        err,
        [
            f"removed the unfinished .{snapshot}.tmp-",
            f"put back snapshots/{snapshot}, which a kill left renamed aside",
        ],
    )
    assert_same_run(root, out, reference)
    for name in SNAPSHOTS:
        assert_same_weights(
            load_file(str(snapshots / name / "model.safetensors")),
            load_file(str(root / "reference" / "snapshots" / name / "model.safetensors")),
        )


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_checkpoint_and_exit(
    setup: tuple[Path, dict[str, torch.Tensor]],
    children: list[subprocess.Popen[str]],
    sig: signal.Signals,
    code: int,
) -> None:
    """The signal comes as the first step starts (no timer): the run checkpoints the step it
    is at, exits with 128 + the signal's number, and resumes bit for bit."""
    root, reference = setup
    out = f"signal-{sig.name}"
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), "--", *train_args(root, out, [])],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children.append(proc)
    wait_ready(proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
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
