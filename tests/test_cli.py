"""The command line's main job, end to end on a tiny corpus: ``aiayn demo``."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.cli import main
from tests.conftest import TRANSLATION_TOML, write_corpus


def test_demo_trains_a_fixed_number_of_steps_translates_and_scores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_corpus(tmp_path / "data")
    (tmp_path / "demo.toml").write_text(TRANSLATION_TOML)
    args = [
        "demo",
        "--config",
        str(tmp_path / "demo.toml"),
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "run"),
        "--sentences",
        "3",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "6 steps" in out and "GFLOP/s" in out  # fixed work, and the host's rate beside it
    assert "step 6 of 6" in out and "peak memory" in out
    assert out.count("  source     ") == 3 and "BLEU" in out.split("test_2016_flickr")[-1]
    # Run again: the finished run is reused, not retrained.
    assert main(args) == 0
    assert "already complete" in capsys.readouterr().out
    # Another recipe into the same folder starts again.
    assert main([*args, "--set", "train.max_steps=4"]) == 0
    assert "step 4 of 4" in capsys.readouterr().out


def test_every_set_option_counts(capsys: pytest.CaptureFixture[str]) -> None:
    # argparse kept only the last of several --set options.
    assert (
        main(
            [
                "info",
                "gpt2-small",
                "--set",
                "n_layers=2",
                "--set",
                "d_model=64",
                "attention.n_heads=2",
            ]
        )
        == 0
    )
    assert "layers 2, d_model 64, heads 2" in capsys.readouterr().out


def test_the_command_line_imports_no_torch_until_a_command_runs() -> None:
    """``aiayn --help`` and every parser are built without torch (nor numpy): each command
    imports what it needs when it runs.  Run in a fresh interpreter, since this one has torch."""
    import subprocess
    import sys

    code = (
        "import sys; from aiayn.cli import build_parser; build_parser();"
        " print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_parsers_hf_families_are_the_interop_families() -> None:
    from aiayn.cli.models import HF_FAMILIES
    from aiayn.interop.families import FAMILIES

    assert tuple(FAMILIES) == HF_FAMILIES
