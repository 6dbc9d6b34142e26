"""Writing folders so that a crash at any instant loses nothing.

A folder is written under a temporary name beside its target (same filesystem), each file is
flushed to disk (``fsync``), a manifest of every file's size and SHA-256 is added, the folder
itself is flushed, and only then is it renamed into place and the parent flushed.  Replacing
an existing folder uses Linux's ``renameat2(RENAME_EXCHANGE)``, which swaps the two names in
one step, so there is never an instant without a complete folder at the target; where that
call is missing, the old folder is first renamed aside and ``recover`` puts it back if a
crash falls between the two renames.

Every file-system step calls ``fs_step`` with its name.  Nothing happens there unless a
test has installed a hook with ``set_fault_hook``: the fault-injection tests kill the
process or raise ``ENOSPC`` at each named step and check that nothing is lost.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from aiayn.errors import CheckpointError

MANIFEST_FILE = "manifest.json"
TMP_MARK = ".tmp-"  # temporary folders are named .NAME.tmp-XXXX
OLD_MARK = ".old-"  # a replaced folder waiting for deletion: .NAME.old-PID

_fault_hook: Callable[[str], None] | None = None


def set_fault_hook(hook: Callable[[str], None] | None) -> None:
    """Install (or remove, with None) a function called with the name of every file-system
    step of a commit; the fault-injection tests use it to kill or fail at that step."""
    global _fault_hook
    _fault_hook = hook


def fs_step(name: str) -> None:
    if _fault_hook is not None:
        _fault_hook(name)


def fsync_path(path: Path) -> None:
    """Flush a file's or a folder's contents (a folder's: its entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    """Every file under ``folder``, subfolders included (a sharded checkpoint's ``dcp/``)."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


def write_manifest(folder: Path) -> None:
    """Record every file's size and SHA-256 in ``manifest.json`` (written last); files in
    subfolders are named by their path relative to ``folder``."""
    files = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in _files(folder)
        if p.relative_to(folder).as_posix() != MANIFEST_FILE
    }
    (folder / MANIFEST_FILE).write_text(json.dumps({"format": 1, "files": files}, indent=1))


def inside(folder: Path, name: object, where: str, *, flat: bool = False) -> Path:
    """``folder / name`` for a file name read from a file (``where`` names it), refused with a
    ValueError unless it is a relative path that stays inside ``folder``: no absolute path, no
    ``..``, no symbolic link that leads out (or loops).  With ``flat``, a plain name: no
    subfolder either."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise CheckpointError(f"{where}: {name!r} is not a file name")
    relative = Path(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise CheckpointError(f"{where}: {name!r} is not a file inside {folder}")
    if flat and relative.parts != (name,):
        raise CheckpointError(f"{where}: {name!r} is not a plain file name in {folder}")
    path = folder / relative
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as err:  # a symbolic link that loops
        raise CheckpointError(f"{where}: {name!r} cannot be resolved in {folder}: {err}") from err
    if not resolved.is_relative_to(folder.resolve()):
        raise CheckpointError(f"{where}: {name!r} leads out of {folder} (a symbolic link)")
    return path


def verify_manifest(folder: Path) -> None:
    """Raise ValueError naming the first file that is missing, truncated or altered.  A folder
    without a manifest (written by an older aiayn) is accepted as it is."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"corrupt manifest {path}: {err}") from err
    well_formed = isinstance(files, dict) and all(
        isinstance(meta, dict)
        and isinstance(meta.get("size"), int)
        and isinstance(meta.get("sha256"), str)
        for meta in files.values()
    )
    if not well_formed:
        raise CheckpointError(
            f'corrupt manifest {path}: expected {{"files": {{NAME: {{"size": BYTES,'
            f' "sha256": HEX}}}}}}'
        )
    for name, meta in files.items():
        f = inside(folder, name, str(path))
        if not f.is_file():
            raise CheckpointError(f"checkpoint file {f} is missing (listed in {MANIFEST_FILE})")
        size = f.stat().st_size
        if size != meta["size"]:
            raise CheckpointError(
                f"checkpoint file {f} is truncated or altered: {size} bytes, expected"
                f" {meta['size']}"
            )
        if sha256_file(f) != meta["sha256"]:
            raise CheckpointError(f"checkpoint file {f} is corrupt: its SHA-256 does not match")


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _renameat2() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAMEAT2 = _renameat2()


def exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False where the system cannot."""
    if _RENAMEAT2 is None:
        return False
    if _RENAMEAT2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, f"cannot exchange {a} and {b}: {os.strerror(err)}")


def recover(target: Path, *, remove: bool = True) -> None:
    """Undo what a crash may have left beside ``target``: a replaced folder renamed aside is
    put back if ``target`` itself is missing, and, with ``remove``, temporary folders and older
    replaced copies are deleted.  Only a writer removes (it alone knows that no one else is
    writing there: aiayn/checkpoint/run_lock.py); a reader passes ``remove=False``, so that
    loading a checkpoint never deletes the folder a live writer is filling."""
    parent = target.parent
    if not parent.is_dir():
        return
    olds = sorted(parent.glob(f".{target.name}{OLD_MARK}*"))
    if not target.exists() and olds:
        os.replace(olds[-1], target)
        olds = olds[:-1]
    if not remove:
        return
    for stale in [*olds, *parent.glob(f".{target.name}{TMP_MARK}*")]:
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _named_write_errors(target: Path) -> Iterator[None]:
    try:
        yield
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise OSError(
                err.errno,
                f"no space left on the device while writing {target};"
                " the folder there before (if any) is intact",
            ) from err
        raise


def write_atomically(target: str | os.PathLike[str], fill: Callable[[Path], None]) -> Path:
    """Let ``fill`` write a temporary folder, then move it to ``target`` in one step.

    On any failure the temporary folder is removed and an existing ``target`` is untouched.
    """
    target = Path(target)
    tmp = begin_folder(target)
    with _named_write_errors(target), _removed_on_failure(tmp):
        fill(tmp)
    commit_folder(tmp, target)
    return target


def begin_folder(target: Path) -> Path:
    """The first half of ``write_atomically``: a new temporary folder beside ``target``
    (after repairing what an earlier crash left there).  Several processes may fill it (a
    sharded checkpoint: every rank writes its shard) before one calls ``commit_folder``."""
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"cannot write to {target}: it exists and is not a folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    recover(target)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}{TMP_MARK}", dir=target.parent))


def commit_folder(tmp: Path, target: Path) -> None:
    """The second half: manifest, flush every file and folder, move ``tmp`` to ``target`` in
    one step.  On failure ``tmp`` is removed and an existing ``target`` is untouched."""
    with _named_write_errors(target), _removed_on_failure(tmp):
        fs_step("files-written")
        write_manifest(tmp)
        for f in _files(tmp):
            fsync_path(f)
        for d in sorted((p for p in tmp.rglob("*") if p.is_dir()), reverse=True):
            fsync_path(d)
        fsync_path(tmp)
        fs_step("files-synced")
        _move_into_place(tmp, target)


@contextlib.contextmanager
def _removed_on_failure(tmp: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _move_into_place(tmp: Path, target: Path) -> None:
    if not target.exists():
        os.replace(tmp, target)
        fs_step("renamed")
        fsync_path(target.parent)
        return
    if exchange(tmp, target):  # target now holds the new folder, tmp the old one
        fs_step("exchanged")
        fsync_path(target.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = target.with_name(f".{target.name}{OLD_MARK}{os.getpid()}")
    os.replace(target, old)
    fs_step("old-moved-aside")  # a crash here is undone by recover()
    os.replace(tmp, target)
    fs_step("renamed")
    fsync_path(target.parent)
    shutil.rmtree(old, ignore_errors=True)
