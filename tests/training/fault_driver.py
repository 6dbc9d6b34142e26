"""Runs ``aiayn train`` in a child process for the fault-injection tests.

    python fault_driver.py [--kill-at POINT] [--no-exchange] -- <aiayn train arguments>

or, without a new interpreter's start-up, :func:`run_child` in a process forked from one that
imported this module (multiprocessing's forkserver, tests/training/test_faults.py).

Prints "ready" (flushed) when the first training step starts, so that the parent can send a
signal from there.  With ``--kill-at`` the process kills itself with SIGKILL at a point named
in advance -- never at an instant that depends on the host's speed:

``step:K``
    just after the K-th training step this process runs has updated the model, before that
    step is logged or checkpointed (K counts from 1 in every process, resumed or not);
``NAME:N``
    at the N-th file-system step called NAME of a folder commit in this process
    (aiayn/atomic.py and run_dir.py: files-written, renamed, exchanged, ...);
``mid-shard:N``
    in the middle of writing the DCP shard of the N-th checkpoint of this process
    (aiayn/checkpoint/sharded.py): after its first tensors are in the shard file, before the
    rest and before DCP's ``.metadata``.

``--no-exchange`` makes the process behave as on a system without
``renameat2(RENAME_EXCHANGE)``: an existing folder is renamed aside before it is replaced.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint.filesystem as dcp_fs

from aiayn import atomic
from aiayn.cli import main
from aiayn.training.step import TrainStep

MID_SHARD_ITEM = 3  # the kill comes after this many tensors of the shard are written


def die() -> None:
    """SIGKILL this process: nothing is flushed, no handler or ``finally`` runs."""
    os.kill(os.getpid(), signal.SIGKILL)


def parse_point(spec: str) -> tuple[str, int]:
    name, _, nth = spec.partition(":")
    if not name or not nth.isdigit() or int(nth) < 1:
        raise SystemExit(f"--kill-at {spec!r}: expected NAME:N with N >= 1")
    return name, int(nth)


def kill_at_commit_step(name: str, nth: int) -> None:
    """Die at the ``nth`` file-system step called ``name``."""
    seen = {"n": 0}

    def hook(step: str) -> None:
        if step == name:
            seen["n"] += 1
            if seen["n"] == nth:
                die()

    atomic.set_fault_hook(hook)


def kill_mid_shard(nth: int) -> None:
    """Die while DCP writes the shard of the ``nth`` checkpoint: the commits before it are
    counted by their last step, ``old-removed``."""
    commits, items = {"done": 0}, {"n": 0}

    def hook(step: str) -> None:
        if step == "old-removed":
            commits["done"] += 1

    write_item = dcp_fs._write_item

    def wrapped(transforms: Any, stream: Any, *args: Any, **kwargs: Any) -> Any:
        result = write_item(transforms, stream, *args, **kwargs)
        if commits["done"] == nth - 1:
            items["n"] += 1
            if items["n"] == MID_SHARD_ITEM:
                stream.flush()  # what is written so far reaches the file, as a real kill finds
                die()
        return result

    atomic.set_fault_hook(hook)
    dcp_fs._write_item = wrapped


def kill_after_step(k: int) -> None:
    """Die just after the ``k``-th step this process runs (see the module docstring)."""
    call, runs = TrainStep.__call__, {"n": 0}

    def wrapped(self: TrainStep, step: int) -> Any:
        outcome = call(self, step)
        runs["n"] += 1
        if runs["n"] == k:
            die()
        return outcome

    TrainStep.__call__ = wrapped  # type: ignore[method-assign]


def install_kill(spec: str) -> None:
    name, nth = parse_point(spec)
    if name == "step":
        kill_after_step(nth)
    elif name == "mid-shard":
        kill_mid_shard(nth)
    else:
        kill_at_commit_step(name, nth)


def announce_first_step() -> None:
    call = TrainStep.__call__
    said: list[bool] = []

    def wrapped(self: TrainStep, step: int) -> Any:
        if not said:
            said.append(True)
            print("ready", flush=True)
        return call(self, step)

    TrainStep.__call__ = wrapped  # type: ignore[method-assign]


def no_exchange() -> None:
    """As where ``renameat2(RENAME_EXCHANGE)`` is missing (atomic.exchange says so)."""

    def cannot(a: Path, b: Path) -> bool:
        return False

    atomic.exchange = cannot


def run(argv: list[str]) -> int:
    while argv and argv[0] != "--":
        if argv[0] == "--kill-at" and len(argv) > 1:
            install_kill(argv[1])
            argv = argv[2:]
        elif argv[0] == "--no-exchange":
            no_exchange()
            argv = argv[1:]
        else:
            raise SystemExit(f"fault_driver.py: unknown option {argv[0]!r}")
    announce_first_step()
    return main(["train", *argv[1:]])


def run_child(argv: list[str], log: str) -> None:
    """:func:`run` in a forked child, its stdout and stderr written to the file ``log`` (line
    by line, so that what was printed before a SIGKILL is there); exits with run's code."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.exit(run(argv))


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
