"""The run folder's layout and its crash recovery, file by file."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from aiayn import build_model
from aiayn.checkpoint import RunDir, TrainState
from aiayn.checkpoint.run_dir import STATE_FILE
from aiayn.data.tokenizer import CharTokenizer


def small() -> tuple[torch.nn.Module, CharTokenizer]:
    tok = CharTokenizer.from_text("abcdef")
    model = build_model(
        "gpt2-small",
        n_layers=1,
        d_model=16,
        attention={"n_heads": 2},
        ffn={"d_ff": 16},
        vocab_size=6,
        max_len=8,
    )
    return model, tok


def state(step: int) -> TrainState:
    return TrainState(step, {}, torch.get_rng_state(), {"epoch": 0}, [])


def test_pointer_follows_the_newest_and_old_ones_go(tmp_path: Path) -> None:
    model, tok = small()
    rd = RunDir(tmp_path / "run")
    rd.root.mkdir()
    rd.save_checkpoint(model, tok, {}, state(3))  # type: ignore[arg-type]
    rd.save_checkpoint(model, tok, {}, state(6))  # type: ignore[arg-type]
    assert rd.pointer.is_symlink()
    assert os.readlink(rd.pointer) == os.path.join("checkpoints", "step_000000006")
    assert [p.name for p in rd.checkpoints.iterdir()] == ["step_000000006"]
    assert rd.load()[1].step == 6


def test_recover_after_a_kill_between_rename_and_switch(tmp_path: Path) -> None:
    model, tok = small()
    rd = RunDir(tmp_path / "run")
    rd.root.mkdir()
    rd.save_checkpoint(model, tok, {}, state(3))  # type: ignore[arg-type]
    # The state a kill leaves after "renamed", before "pointer-switched": a newer complete
    # folder, the pointer still on the older one, and a temporary link and folder about.
    newer = rd.checkpoints / "step_000000006"
    os.system(f"cp -r {rd.checkpoints / 'step_000000003'} {newer}")
    torch.save(vars(state(6)), newer / STATE_FILE)
    (newer / "manifest.json").unlink()
    os.symlink("checkpoints/step_000000006", rd.root / ".checkpoint.tmp-link")
    (rd.checkpoints / ".step_000000009.tmp-abc").mkdir()
    notes = rd.recover()
    assert os.readlink(rd.pointer).endswith("step_000000006")
    assert sorted(p.name for p in rd.checkpoints.iterdir()) == ["step_000000006"]
    assert not (rd.root / ".checkpoint.tmp-link").exists()
    assert any("pointed checkpoint" in n for n in notes)
    assert rd.load()[1].step == 6


def test_a_checkpoint_folder_of_the_old_layout_is_adopted(tmp_path: Path) -> None:
    model, tok = small()
    rd = RunDir(tmp_path / "run")
    rd.root.mkdir()
    rd.save_checkpoint(model, tok, {}, state(4))  # type: ignore[arg-type]
    # Rebuild the layout of aiayn 0.1: checkpoint/ was a real folder.
    real = rd.checkpoints / "step_000000004"
    rd.pointer.unlink()
    os.replace(real, rd.pointer)
    rd.checkpoints.rmdir()
    rd.recover()
    assert rd.pointer.is_symlink() and rd.load()[1].step == 4


def test_dangling_pointer_and_empty_run(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    rd.root.mkdir()
    os.symlink("checkpoints/step_000000001", rd.pointer)
    assert rd.holds_run()
    rd.recover()
    assert not rd.pointer.is_symlink() and rd.latest() is None and not rd.holds_run()
