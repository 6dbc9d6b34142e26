"""``pip install aiayn`` alone, into a fresh virtual environment: the core trains and translates.

Not a view of this environment (tests/test_extras.py does that, for the missing-extra
messages): a new venv, ``pip install`` of this source tree without extras (its build, its
declared dependencies), then the installed ``aiayn`` command trains a few steps and
translates.  torch is pinned to the CPU wheel that the Makefile names, as a user of this
machine would, so that pip does not resolve ``torch>=2.5`` to a CUDA build; that build is this
environment's own, linked into the new one (its files and its dist-info) rather than unpacked
again: 700 MB of copying would be most of the test's time and prove nothing more.  pip still
resolves everything else, torch's own requirements included.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TRANSLATION_TOML, write_corpus

ROOT = Path(__file__).resolve().parent.parent
EXTRAS_ONLY = ("fastapi", "uvicorn", "plotly", "matplotlib", "sklearn", "mlxtend", "transformers")


def torch_pin() -> str:
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("TORCH := torch=="):
            return line.removeprefix("TORCH := ").strip()
    raise AssertionError("the Makefile pins no TORCH := torch==")


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=280, check=False)


def link_torch(venv: Path) -> None:
    """This environment's torch (its packages and dist-info), linked from a folder of its own
    that a .pth file puts on ``venv``'s path: outside the venv, so that pip, which never
    uninstalls outside its environment, cannot touch this environment's files through it."""
    import torch

    assert torch.__version__.split("+")[0] == torch_pin().split("==")[1]
    here = Path(torch.__file__).resolve().parent.parent
    links = venv.parent / "torch-links"
    links.mkdir()
    for name in [
        "torch",
        "functorch",
        "torchgen",
        *(p.name for p in here.glob("torch-*.dist-info")),
    ]:
        (links / name).symlink_to(here / name)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "torch-links.pth").write_text(f"{links}\n")


@pytest.mark.slow
def test_the_core_installs_alone_and_trains_and_translates(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    assert made.returncode == 0, made.stderr
    python, aiayn = venv / "bin" / "python", venv / "bin" / "aiayn"
    link_torch(venv)
    # The package's own files, as an sdist holds them: pip builds and installs from there.
    src = tmp_path / "src"
    shutil.copytree(ROOT / "aiayn", src / "aiayn", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    pip = run([str(python), "-m", "pip", "install", "-q", torch_pin(), str(src)], tmp_path)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    probe = f"import importlib.util as u; print([m for m in {EXTRAS_ONLY!r} if u.find_spec(m)])"
    assert run([str(python), "-c", probe], tmp_path).stdout.strip() == "[]"  # no extra came along

    work = tmp_path / "work"
    write_corpus(work / "data")
    (work / "run.toml").write_text(TRANSLATION_TOML)
    train = run([str(aiayn), "train", "run.toml", "--out", "run", "--data", "data"], work)
    assert train.returncode == 0, train.stderr
    (work / "in.txt").write_text("ein hund läuft\nzwei katzen\n")
    out = run(
        [
            str(aiayn),
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
        work,
    )
    assert out.returncode == 0, out.stderr
    assert len((work / "out.txt").read_text().splitlines()) == 2
