"""The core install works without any extra, and a command that needs one names it.

A child process runs on a view of the environment's site-packages without the packages the
extras bring (``python -S`` with only that view on its path: to it they are not installed, as
after ``pip install aiayn``); in it, the core trains a translation model and translates, and
the commands that need an extra stop with one line naming ``pip install 'aiayn[EXTRA]'``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
from pathlib import Path

import pytest

from aiayn.extras import EXTRAS, advice
from tests.conftest import TRANSLATION_TOML, write_corpus

ROOT = Path(__file__).resolve().parent.parent

# What the extras install, by the top-level names they put in site-packages.
HIDDEN_DIRS = {
    "fastapi",
    "uvicorn",
    "starlette",
    "pydantic",
    "pydantic_core",
    "uvloop",
    "httptools",
    "plotly",
    "matplotlib",
    "mpl_toolkits",
    "sklearn",
    "mlxtend",
    "transformers",
    "sentencepiece",
    "google",
    "sentence_transformers",
}

CHILD = """
import sys
from aiayn.cli import main
code = main({argv!r})
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {hidden!r})
print("LOADED", loaded)
sys.exit(code)
"""


def core_site(tmp: Path) -> Path:
    """A folder of links to everything in site-packages but what the extras install (their
    packages and their .dist-info), made once per test folder."""
    view = tmp / "core-site"
    if view.is_dir():
        return view
    view.mkdir()
    hidden = HIDDEN_DIRS | {"scikit_learn", "protobuf"}  # distributions named otherwise
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        top = entry.name.split("-")[0].split(".")[0].lower()
        if top not in hidden and entry.suffix != ".pth":
            (view / entry.name).symlink_to(entry)
    return view


def run_core(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(CHILD.format(hidden=sorted(HIDDEN_DIRS), argv=argv))
    env = {**os.environ, "PYTHONPATH": f"{core_site(cwd)}{os.pathsep}{ROOT}"}
    return subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.mark.slow
def test_the_core_trains_and_translates_without_extras(tmp_path: Path) -> None:
    write_corpus(tmp_path / "data")
    (tmp_path / "run.toml").write_text(TRANSLATION_TOML + 'linear_kernel = "mkl"\n')
    train = run_core(["train", "run.toml", "--out", "run", "--data", "data"], tmp_path)
    assert train.returncode == 0, train.stderr
    assert "LOADED []" in train.stdout
    (tmp_path / "in.txt").write_text("ein hund läuft\n")
    out = run_core(
        [
            "translate",
            "--checkpoint",
            "run/checkpoint",
            "--input",
            "in.txt",
            "--output",
            "out.txt",
            "--beam",
            "2",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out.txt").read_text().count("\n") == 1
    assert "LOADED []" in out.stdout


@pytest.mark.slow
def test_a_command_that_needs_an_extra_names_it(tmp_path: Path) -> None:
    for argv, extra in (
        (["serve", "--checkpoint", "x"], "serve"),
        (["explore", "--preset", "gpt2-small"], "explore"),
        (["inspect", "positions", "--out", "figs"], "explore"),
    ):
        got = run_core(argv, tmp_path)
        assert got.returncode == 2, (argv, got.stderr)
        last = got.stderr.strip().splitlines()[-1]
        assert last.startswith("aiayn: error: ") and f"pip install 'aiayn[{extra}]'" in last, last


def test_the_extras_declared_are_the_ones_named() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # the extras aiayn.extras names, and the groups of them: app (make setup), dev, bench
    assert set(declared["optional-dependencies"]) == {*EXTRAS, "app", "dev", "bench"}
    core = " ".join(declared["dependencies"])
    assert not any(p in core for p in ("fastapi", "plotly", "matplotlib", "scikit", "transformers"))
    assert advice("sklearn.datasets", "train") == (
        "'aiayn train' needs the sklearn package: pip install 'aiayn[vision]'"
    )
    assert advice("fastapi", "explore").endswith("'aiayn[explore]'")  # the command's own extra
    assert advice("numpy", "train") is None  # the core: a real error, not advice
