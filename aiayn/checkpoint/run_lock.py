"""One writer per run folder: a lock that a training run holds while it writes.

Two processes writing one run folder would corrupt it: each one's recovery
(:meth:`aiayn.checkpoint.run_dir.RunDir.recover`) deletes the other's temporary folders, and
their checkpoints replace each other's.  So a run holds ``RUN/.lock`` with ``fcntl.flock``
(exclusive, non-blocking) from before it repairs the folder until it ends; a second writer
gets :class:`RunFolderLocked`, naming the holder's process id, which the holder writes into the
file.  The kernel releases the lock when the holder's process ends, however it ends: a run
that was killed leaves no stale lock behind.  Readers -- generate, serve, evaluate, a
checkpoint's load -- never take it and never delete anything (aiayn/checkpoint/model.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".lock"


class RunFolderLocked(ValueError):
    """Another process is writing the run folder."""


@contextlib.contextmanager
def writer_lock(root: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``root``'s writer lock for the block (``root`` is created if missing); raise
    :class:`RunFolderLocked` at once if another process holds it."""
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "a process"
        os.close(fd)
        raise RunFolderLocked(
            f"{folder} is being written by {holder}: wait for that run to end, or write this"
            " one to another --out"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
