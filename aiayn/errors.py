"""The exceptions the command line turns into exit codes, in a module that imports nothing:
``aiayn.cli.main`` catches them without importing torch.

A mistake a user can make (a wrong setting, a folder that is not a checkpoint, a request the
model cannot take) raises a ``UserError``: the command line prints its one line and exits
with 2, the server answers 400.  Anything else is a bug: it keeps its traceback (exit 1, or a
500 whose details stay in the server's log).  ``UserError`` is a ``ValueError``, so code that
caught ``ValueError`` before still catches it.
"""

from __future__ import annotations


class UserError(ValueError):
    """A value a user gave is wrong; the message names it and says what was expected."""


class ConfigError(UserError):
    """A model, training or experiment setting is unknown, mistyped or out of range."""


class CheckpointError(UserError):
    """A folder or file to load is not what it claims: missing files, a wrong layout, a
    checksum or shape that does not match, or an architecture aiayn cannot read."""


class RequestError(UserError):
    """Input to a model cannot be served: too long, empty, out of the vocabulary or range."""


class DeprecatedSetting(FutureWarning):
    """A setting spelled the way of older configs (a flat ``n_heads`` for
    ``attention.n_heads``): it is still read, and the warning names the spelling to write."""


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
