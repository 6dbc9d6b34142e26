"""Atomic folder writes: exchange when the system has it, and recovery when it does not."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiayn.checkpoint import atomic


def fill_with(text: str):  # type: ignore[no-untyped-def]
    return lambda folder: (folder / "a.txt").write_text(text)


def test_replace_keeps_one_complete_folder(tmp_path: Path) -> None:
    target = tmp_path / "m"
    atomic.write_atomically(target, fill_with("one"))
    atomic.write_atomically(target, fill_with("two"))
    assert (target / "a.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    atomic.verify_manifest(target)


@pytest.mark.parametrize(
    "manifest", ['{"files": [1]}', '{"files": {"a.txt": {"bytes": 3}}}', '{"files": {"a.txt": 3}}']
)
def test_a_malformed_manifest_is_named_corrupt(tmp_path: Path, manifest: str) -> None:
    # Valid JSON of the wrong shape raised KeyError / AttributeError from inside the check.
    target = tmp_path / "m"
    atomic.write_atomically(target, fill_with("one"))
    (target / atomic.MANIFEST_FILE).write_text(manifest)
    with pytest.raises(ValueError, match="corrupt manifest .*expected"):
        atomic.verify_manifest(target)


def test_without_exchange_a_kill_between_the_renames_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "m"
    atomic.write_atomically(target, fill_with("one"))
    monkeypatch.setattr(atomic, "exchange", lambda a, b: False)

    class Killed(Exception):
        pass

    def kill(step: str) -> None:
        if step == "old-moved-aside":
            raise Killed

    atomic.set_fault_hook(kill)
    try:
        with pytest.raises(Killed):
            atomic.write_atomically(target, fill_with("two"))
    finally:
        atomic.set_fault_hook(None)
    # write_atomically cleaned its temporary folder; the old one was aside: a real kill
    # would leave exactly this.
    assert not target.exists()
    atomic.recover(target)
    assert (target / "a.txt").read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_exchange_swaps_two_folders(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    (b / "x").write_text("b")
    if not atomic.exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"


def test_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match="not a folder"):
        atomic.write_atomically(tmp_path / "f", fill_with("x"))
    assert os.listdir(tmp_path) == ["f"]
