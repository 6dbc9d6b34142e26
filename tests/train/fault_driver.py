"""Runs ``aiayn train`` in a child process for the fault-injection tests.

    python fault_driver.py [--kill-at STEP_NAME:N] -- <aiayn train arguments>

Prints "ready" (flushed) when the first training step starts, so that the parent can time a kill
from there.  With ``--kill-at NAME:N`` the process kills itself with SIGKILL at the N-th
file-system step called NAME of a checkpoint commit (aiayn/checkpoint/atomic.py).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from aiayn.checkpoint.atomic import set_fault_hook
from aiayn.cli import main
from aiayn.train.step import TrainStep


def install_kill(spec: str) -> None:
    name, _, nth = spec.partition(":")
    seen = {"n": 0}

    def hook(step: str) -> None:
        if step == name:
            seen["n"] += 1
            if seen["n"] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)

    set_fault_hook(hook)


def announce_first_step() -> None:
    call = TrainStep.__call__
    said = []

    def wrapped(self: TrainStep, step: int) -> Any:
        if not said:
            said.append(True)
            print("ready", flush=True)
        return call(self, step)

    TrainStep.__call__ = wrapped  # type: ignore[method-assign]


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--kill-at"]:
        install_kill(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    announce_first_step()
    sys.exit(main(["train", *argv]))
