"""Writers of a run folder exclude each other, and readers delete nothing: a second training
run on a folder being written is refused with the first one's process id; loading a
checkpoint beside a live writer's temporary folder leaves it alone; the lock is given back when
a run ends, fails, or its process is killed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import aiayn
from aiayn.checkpoint.run_lock import LOCK_FILE, RunFolderLocked, writer_lock
from aiayn.cli import main
from tests.conftest import LM_TEXT, LM_TOML


def train(root: Path, *extra: str) -> int:
    (root / "corpus.txt").write_text(LM_TEXT)
    (root / "run.toml").write_text(LM_TOML)
    argv = ["train", str(root / "run.toml"), "--out", str(root / "run"), "--data", str(root)]
    return main([*argv, "--set", "train.max_steps=2", *extra])


def test_a_second_writer_is_refused_with_the_holders_pid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with writer_lock(tmp_path / "run"):  # a run writing the folder (this process, another fd)
        assert train(tmp_path) == 2
    err = capsys.readouterr().err
    assert f"is being written by process {os.getpid()}" in err
    assert not (tmp_path / "run" / "checkpoint").exists()
    assert train(tmp_path) == 0  # given back: the next run writes


def test_the_lock_is_given_back_after_a_failure_and_a_kill(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), writer_lock(tmp_path):
        raise RuntimeError("the run failed")
    with writer_lock(tmp_path):  # free again
        pass
    hold_and_die = (
        "import fcntl, os, signal, sys;"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT);"
        "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB);"
        "os.kill(os.getpid(), signal.SIGKILL)"
    )
    done = subprocess.run([sys.executable, "-c", hold_and_die, str(tmp_path / LOCK_FILE)])
    assert done.returncode == -9  # killed while holding it
    with writer_lock(tmp_path):  # the kernel gave it back
        pass


def test_a_held_lock_names_its_holder(tmp_path: Path) -> None:
    refused = pytest.raises(RunFolderLocked, match=f"process {os.getpid()} on")
    with writer_lock(tmp_path), refused, writer_lock(tmp_path):
        pass


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
