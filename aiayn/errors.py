"""The exceptions the command line turns into exit codes, in a module that imports nothing:
``aiayn.cli.main`` catches them without importing torch."""

from __future__ import annotations


class NonFiniteLoss(FloatingPointError):
    """The loss or the gradient became NaN or infinite; the last good checkpoint stays."""


class TrainingInterrupted(Exception):
    """Training stopped on a signal after writing a checkpoint at ``step``."""

    def __init__(self, step: int, signal_name: str, checkpoint: str) -> None:
        super().__init__(
            f"{signal_name} received: stopped after step {step} with a checkpoint in"
            f" {checkpoint}; continue with --resume"
        )
        self.step, self.signal_name, self.checkpoint = step, signal_name, checkpoint
