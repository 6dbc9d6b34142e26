"""When a run writes what: resumable checkpoints, snapshots for averaging, and a checkpoint on
request when the process is told to stop (SIGTERM, or Ctrl-C)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

from aiayn.config.run import TrainConfig


def snapshot_steps(tc: TrainConfig) -> set[int]:
    """The ``keep_snapshots`` steps kept for averaging: spread evenly over the last
    ``snapshot_fraction`` of the run and ending at its last step, whatever its length (§6.1
    averages the last 5 checkpoints, written 10 minutes apart at the end of training)."""
    k, total = tc.keep_snapshots, tc.max_steps
    if k == 0:
        return set()
    span = max(k, round(tc.snapshot_fraction * total))
    gap = span / k
    return {max(1, total - round(i * gap)) for i in range(k)}


@dataclass
class CheckpointPolicy:
    tc: TrainConfig
    snapshots: set[int] = field(init=False)

    def __post_init__(self) -> None:
        self.snapshots = snapshot_steps(self.tc)

    def checkpoint_due(self, done: int, end: int) -> bool:
        return done % self.tc.checkpoint_interval == 0 or done == end

    def snapshot_due(self, done: int) -> bool:
        return done in self.snapshots

    def evaluation_due(self, done: int, end: int) -> bool:
        """At every interval, and always at the last step: the final figures are the final
        model's."""
        return done % self.tc.eval_interval == 0 or done == end


@dataclass
class StopRequest:
    """Set by SIGTERM or the first Ctrl-C; the loop finishes its step, checkpoints, stops."""

    signum: int | None = None

    @property
    def name(self) -> str:
        return "" if self.signum is None else signal.Signals(self.signum).name


@contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Within the block SIGTERM and SIGINT ask the loop to stop cleanly (a second Ctrl-C
    interrupts at once).  Outside the main thread, signals are left alone."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        request.signum = signum
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C: now

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield request
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
