"""A user's mistake against a bug, as the command line and the server tell them apart.

A :class:`~aiayn.errors.UserError` (a wrong setting, a folder that is not a checkpoint) is one
line and exit 2; a plain ``ValueError`` raised inside aiayn is a bug: it exits 1 and keeps its
traceback, so that it is reported rather than taken for the user's fault.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aiayn.errors import CheckpointError, ConfigError, RequestError, UserError

ROOT = Path(__file__).resolve().parent.parent

# `aiayn presets` with its command replaced by one that raises ``error``: the rest of `main`
# (its logging, its mapping of exceptions to exit codes) runs as it does for a user.
PLANTED = """
import sys
import aiayn.cli as cli
import aiayn.cli.models as models

def broken(args):
    raise {error}

models.cmd_presets = broken  # the parser is built inside main, after this
sys.exit(cli.main(["presets"]))
"""


def _run_planted(error: str) -> subprocess.CompletedProcess[str]:
    code = PLANTED.format(error=error)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_a_user_error_is_one_line_and_exit_2() -> None:
    done = _run_planted('__import__("aiayn.errors").errors.ConfigError("lr = -1 is invalid")')
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == "aiayn: error: lr = -1 is invalid"
    assert "Traceback" not in done.stderr


def test_an_internal_value_error_keeps_its_traceback_and_exits_1() -> None:
    done = _run_planted('ValueError("an index went out of step")')
    assert done.returncode == 1, done.stderr
    assert "Traceback (most recent call last)" in done.stderr
    assert "ValueError: an index went out of step" in done.stderr


@pytest.mark.parametrize("kind", [ConfigError, CheckpointError, RequestError])
def test_every_kind_of_user_error_is_a_user_error_and_a_value_error(kind: type) -> None:
    # callers that caught ValueError before still catch every user mistake
    assert issubclass(kind, UserError) and issubclass(kind, ValueError)


def test_a_bad_setting_raises_a_config_error_naming_it() -> None:
    from aiayn.config import AttentionConfig

    with pytest.raises(ConfigError, match="n_heads"):
        AttentionConfig(n_heads=0)


def test_a_folder_that_is_not_a_checkpoint_raises_a_checkpoint_error(tmp_path: Path) -> None:
    from aiayn.checkpoint import load

    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(CheckpointError):
        load(tmp_path)
