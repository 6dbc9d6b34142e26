"""Atomic folder writes: exchange when the system has it, and recovery when it does not."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aiayn import atomic


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


def hostile_manifest(tmp_path: Path, name: str) -> Path:
    """A committed folder whose manifest also lists ``name``, said to hold the two bytes of
    ``outside.txt`` beside the folder; ``link.txt`` in it leads there, ``loop.txt`` to itself."""
    target = tmp_path / "m"
    atomic.write_atomically(target, fill_with("one"))
    outside = tmp_path / "outside.txt"
    outside.write_text("12")
    (target / "link.txt").symlink_to(outside)
    (target / "loop.txt").symlink_to(target / "loop.txt")
    path = target / atomic.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["files"][name] = {"size": 2, "sha256": atomic.sha256_file(outside)}
    path.write_text(json.dumps(manifest))
    return target


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../outside.txt", "is not a file inside"),
        ("sub/../../outside.txt", "is not a file inside"),
        ("ABSOLUTE", "is not a file inside"),
        ("link.txt", r"leads out of .* \(a symbolic link\)"),
        ("loop.txt", "cannot be resolved in"),
        ("a\x00.txt", "is not a file name"),
    ],
)
def test_a_manifest_naming_a_file_outside_the_folder_is_refused(
    tmp_path: Path, name: str, why: str
) -> None:
    """Each name, unchecked, would read (and vouch for) a file outside the folder -- or, the
    loop, raise a RuntimeError from deep inside pathlib."""
    name = str(tmp_path / "outside.txt") if name == "ABSOLUTE" else name
    target = hostile_manifest(tmp_path, name)
    with pytest.raises(ValueError, match=f"m/manifest.json: {re.escape(repr(name))} {why}"):
        atomic.verify_manifest(target)


def test_a_manifest_naming_a_file_inside_through_a_link_is_read(tmp_path: Path) -> None:
    """A link that stays inside the folder is no escape: it is checked like any file."""
    target = tmp_path / "m"
    atomic.write_atomically(target, fill_with("one"))
    (target / "same.txt").symlink_to(target / "a.txt")
    path = target / atomic.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["files"]["same.txt"] = manifest["files"]["a.txt"]
    path.write_text(json.dumps(manifest))
    atomic.verify_manifest(target)


@pytest.mark.parametrize("name", ["sub/a.txt", "./a.txt", "a.txt/"])
def test_flat_names_have_no_folder_part(tmp_path: Path, name: str) -> None:
    assert atomic.inside(tmp_path, name, "where") == tmp_path / name
    with pytest.raises(ValueError, match="where: .* is not a plain file name in"):
        atomic.inside(tmp_path, name, "where", flat=True)


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


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from aiayn import atomic

target, point, no_exchange = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
if no_exchange:
    atomic.exchange = lambda a, b: False
def hook(step):
    if step == point:
        os.kill(os.getpid(), signal.SIGKILL)
atomic.set_fault_hook(hook)
atomic.write_atomically(target, lambda folder: (folder / "a.txt").write_text("two"))
"""


def replace_and_kill(target: Path, point: str, *, no_exchange: bool) -> None:
    """Replace ``target`` (holding "one") by a folder holding "two" in a child process that
    SIGKILLs itself at ``point``: what it leaves is what a real kill leaves (no ``finally``
    cleans up)."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(target), point, "1" if no_exchange else "0"],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard: the child takes a second or two
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, f"not killed at {point}: {done.stderr[-2000:]}"


def exchange_works(folder: Path) -> bool:
    """Whether this system swaps two folders' names in one step (two empty folders tried)."""
    a, b = folder / "x", folder / "y"
    a.mkdir()
    b.mkdir()
    try:
        return atomic.exchange(a, b)
    finally:
        a.rmdir()
        b.rmdir()


def test_a_kill_just_after_the_exchange_leaves_the_new_folder(tmp_path: Path) -> None:
    """Killed after ``exchanged``: the target is already the new, complete folder; the old one
    waits under the temporary name, and recover() removes it."""
    if not exchange_works(tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    target = tmp_path / "m"
    atomic.write_atomically(target, fill_with("one"))
    replace_and_kill(target, "exchanged", no_exchange=False)
    assert (target / "a.txt").read_text() == "two"
    atomic.verify_manifest(target)
    (old,) = tmp_path.glob(f".m{atomic.TMP_MARK}*")
    assert (old / "a.txt").read_text() == "one"
    atomic.recover(target)
    assert (target / "a.txt").read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_real_kill_with_the_old_folder_aside_is_undone(tmp_path: Path) -> None:
    """Without the exchange, killed after ``old-moved-aside``: no folder has the name, the
    old one is aside and the new one complete under its temporary name; recover() puts the
    old one back and removes the rest."""
    target = tmp_path / "m"
    atomic.write_atomically(target, fill_with("one"))
    replace_and_kill(target, "old-moved-aside", no_exchange=True)
    assert not target.exists()
    (aside,) = tmp_path.glob(f".m{atomic.OLD_MARK}*")
    (new,) = tmp_path.glob(f".m{atomic.TMP_MARK}*")
    assert (aside / "a.txt").read_text() == "one" and (new / "a.txt").read_text() == "two"
    atomic.recover(target)
    assert (target / "a.txt").read_text() == "one"
    atomic.verify_manifest(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
