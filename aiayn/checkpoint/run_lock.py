"""One writer per run folder: a lock that a training run holds while it writes.

Two processes writing one run folder would corrupt it: each one's recovery
(``aiayn.checkpoint.run_dir.RunDir.recover``) deletes the other's temporary folders, and
their checkpoints replace each other's.  The rule:

* **Writers** hold ``RUN/.lock`` with ``fcntl.flock`` (exclusive, non-blocking) from before
  they repair the folder until the run ends, however it ends (``writer_lock``; the training
  loop's ``train_run``, and ``aiayn demo`` around its repair).  A second writer gets
  ``RunFolderLocked`` at once, naming the folder and the holder's process id and host,
  which the holder writes into the file; ``aiayn`` turns it into one line and exit status 2.
  Only a writer holding the lock calls ``RunDir.recover``, which deletes temporary files.
* **Several processes** (torchrun): rank 0 holds the lock for them all -- it alone writes the
  shared files, and the other ranks write their shards only into a temporary folder that rank
  0 made under the lock; when rank 0 is refused, every rank fails with its error.
* **Readers** -- generate, serve, evaluate, inspect, any checkpoint's load -- never take the
  lock and never delete anything.  They put back a folder renamed aside (where the system
  cannot exchange two folders in one step, aiayn/atomic.py) only when the process named in
  its ``.NAME.old-PID`` is gone, so a reader never undoes a live writer's replace
  (aiayn/checkpoint/model.py).

The kernel releases the lock when the holder's process ends, however it ends: a run that was
killed leaves no stale lock behind, only a stale process id in the file, which the next holder
overwrites.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from aiayn.errors import UserError

LOCK_FILE = ".lock"


class RunFolderLocked(UserError):
    """Another process is writing the run folder."""


@contextlib.contextmanager
def writer_lock(root: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``root``'s writer lock for the block (``root`` is created if missing); raise
    ``RunFolderLocked`` at once if another process holds it."""
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
