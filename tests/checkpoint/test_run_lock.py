"""Writers of a run folder exclude each other, and readers delete nothing: a second training
run on a folder being written is refused with the first one's process id, before it repairs
anything; the lock is held while a run writes and given back when it ends, fails, or its
process is killed; with several ranks, every rank fails when rank 0 is refused; loading a
checkpoint leaves a live writer's temporary folder, and a folder it renamed aside, alone."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import aiayn
from aiayn import atomic
from aiayn.checkpoint.run_lock import LOCK_FILE, RunFolderLocked, writer_lock
from aiayn.cli import main
from tests.conftest import LM_TEXT, LM_TOML, free_port

HOLDER = """
import sys
from aiayn.checkpoint.run_lock import writer_lock
with writer_lock(sys.argv[1]):
    print("holding", flush=True)
    sys.stdin.read()  # until the test closes it, or kills this process
"""

# Rank 0 and rank 1 of a two-process gloo group, each entering the training loop's writer
# block twice: while the test holds the lock, then (after a line on stdin) once it is free.
RANK = """
import sys
import torch.distributed as dist
from aiayn.checkpoint.run_lock import RunFolderLocked
from aiayn.training.run import _one_writer
folder, rank, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
url = f"tcp://127.0.0.1:{port}"
dist.init_process_group("gloo", init_method=url, rank=rank, world_size=2)
for _ in range(2):
    try:
        with _one_writer(folder):
            print("wrote", flush=True)
    except RunFolderLocked as err:
        print(f"refused: {err}", flush=True)
    sys.stdin.readline()
dist.destroy_process_group()
"""


def train(root: Path, *extra: str) -> int:
    (root / "corpus.txt").write_text(LM_TEXT)
    (root / "run.toml").write_text(LM_TOML)
    argv = ["train", str(root / "run.toml"), "--out", str(root / "run"), "--data", str(root)]
    return main([*argv, "--set", "train.max_steps=2", *extra])


@contextlib.contextmanager
def held_elsewhere(folder: Path) -> Iterator[subprocess.Popen[str]]:
    """``folder``'s writer lock held by another process (yielded) for the block."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        yield holder
    finally:
        holder.kill()
        holder.communicate()


def test_a_second_writer_is_refused_with_the_holders_pid_before_any_repair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    filling = run / "checkpoints" / ".step_000000002.tmp-live"  # the holder's next checkpoint
    filling.mkdir(parents=True)
    (filling / "train_state.pt").write_bytes(b"half")
    with held_elsewhere(run) as holder:
        assert train(tmp_path) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if "aiayn" in line]
        assert errors == [
            f"aiayn: error: {run} is being written by process {holder.pid} on"
            f" {socket.gethostname()}: wait for that run to end, or write this one to"
            " another --out"
        ]
        assert (filling / "train_state.pt").read_bytes() == b"half"
        assert not (run / "checkpoint").exists()
    assert train(tmp_path) == 0  # the holder gone: this run writes, and repairs first
    assert not filling.exists() and (run / "checkpoint").is_dir()


def test_a_run_holds_the_lock_while_it_writes_and_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    refused: list[bool] = []

    def try_the_lock(step: str) -> None:
        """Another writer, trying its luck while the run commits a checkpoint."""
        if step == "files-written":
            try:
                with writer_lock(run):
                    refused.append(False)
            except RunFolderLocked:
                refused.append(True)

    monkeypatch.setattr(atomic, "_fault_hook", try_the_lock)
    assert train(tmp_path) == 0
    assert refused and all(refused)
    monkeypatch.setattr(atomic, "_fault_hook", None)
    with writer_lock(run):  # given back when the run ended
        pass
    assert train(tmp_path, "--resume", "--set", "model.d_model=64") == 2  # fails, locked
    with writer_lock(run):  # given back when the run failed
        pass


def test_the_lock_is_given_back_after_a_failure_and_a_kill(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), writer_lock(tmp_path):
        raise RuntimeError("the run failed")
    with writer_lock(tmp_path):  # free again
        pass
    with held_elsewhere(tmp_path) as holder:
        holder.kill()
        assert holder.wait() == -9  # killed while holding it
        with writer_lock(tmp_path):  # the kernel gave it back
            pass
    holder_now = f"process {os.getpid()} on {socket.gethostname()}\n"
    assert (tmp_path / LOCK_FILE).read_text() == holder_now  # the dead one's pid overwritten


def test_a_held_lock_names_its_holder(tmp_path: Path) -> None:
    refused = pytest.raises(RunFolderLocked, match=f"process {os.getpid()} on")
    with writer_lock(tmp_path), refused, writer_lock(tmp_path):
        pass


@pytest.mark.slow
def test_every_rank_fails_when_rank_0_is_refused(tmp_path: Path) -> None:
    """Without the answer from rank 0, rank 1 would go on into the run (and wait for rank 0
    at the run's first barrier)."""
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(tmp_path), str(rank), port],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    try:
        with writer_lock(tmp_path):
            first = [r.stdout.readline() for r in ranks if r.stdout is not None]
        for r in ranks:  # both go on together: the second attempt is collective, too
            assert r.stdin is not None
            r.stdin.write("\n\n")
            r.stdin.flush()
        second = [r.communicate(timeout=120)[0] for r in ranks]
    finally:
        for r in ranks:
            r.kill()
            r.wait()
    refusal = (
        f"refused: {tmp_path} is being written by process {os.getpid()} on"
        f" {socket.gethostname()}: wait for that run to end, or write this one to another"
        " --out\n"
    )
    assert first == [refusal] * 2
    assert second == ["wrote\n"] * 2
    assert [r.returncode for r in ranks] == [0, 0]


def test_loading_a_checkpoint_deletes_no_writers_temporary_folder(tmp_path: Path) -> None:
    """A writer replacing a checkpoint folder fills ``.NAME.tmp-...`` beside it (a snapshot
    saved again, ``aiayn.save`` to the same folder): a reader loading that folder meanwhile
    leaves the temporary folder alone."""
    assert train(tmp_path) == 0
    current = (tmp_path / "run" / "checkpoint").resolve()
    filling = current.parent / f".{current.name}.tmp-live"
    filling.mkdir()
    (filling / "model.safetensors").write_bytes(b"half")
    aiayn.load(tmp_path / "run" / "checkpoint")
    aiayn.load(current)
    assert (filling / "model.safetensors").read_bytes() == b"half"


def test_a_reader_puts_back_a_folder_renamed_aside_only_once_its_writer_is_gone(
    tmp_path: Path,
) -> None:
    """Where two folders cannot be exchanged, a writer renames the old one aside as
    ``.NAME.old-PID`` and then the new one into place: a reader that put the old one back in
    between would make the writer's rename fail.  Once that process is gone, a crash left it
    there, and the reader puts it back."""
    model = aiayn.build_model(
        "gpt2-small", n_layers=1, d_model=16, attention={"n_heads": 2}, ffn={"d_ff": 16}
    )
    target = aiayn.save(model, tmp_path / "model")
    waits = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    writer = subprocess.Popen(waits, stdin=subprocess.PIPE)
    aside = tmp_path / f".model.old-{writer.pid}"
    os.replace(target, aside)
    try:
        with pytest.raises(ValueError, match=f"being replaced by process {writer.pid}"):
            aiayn.load_model(target)
        assert aside.is_dir() and not target.exists()
    finally:
        writer.kill()
        writer.wait()
    aiayn.load_model(target)  # the writer died between its renames: undone
    assert target.is_dir() and not aside.exists()
