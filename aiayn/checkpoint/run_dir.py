"""A training run's folder: resumable checkpoints that survive a kill at any instant.

::

    RUN/
      checkpoint -> checkpoints/step_000001500   the latest complete checkpoint (a symlink)
      checkpoints/step_000001500/                model, tokenizer, run config, train_state.pt
                                                 (model and optimizer as dcp/ shards in a
                                                 sharded run: aiayn/checkpoint/sharded.py)
      snapshots/step_*/                          model-only copies kept for averaging (§6.1)
      log.csv                                    one row per step, exactly once

A checkpoint is committed in steps, each of which leaves a usable run behind:

1. the folder ``checkpoints/step_N`` is written under a temporary name, flushed to disk with a
   manifest of sizes and SHA-256s, and renamed into place (aiayn/atomic.py);
2. a new symlink is made beside ``checkpoint`` and renamed over it -- one atomic switch;
3. the run folder is flushed, and only then are older checkpoints deleted.

Whatever a kill interrupts, ``RunDir.recover`` finds the newest complete checkpoint (the
highest ``step_N`` folder -- only complete folders ever get that name), points ``checkpoint``
at it and removes temporary leftovers.  tests/training/test_faults.py kills training at each of
these steps and at random instants and checks that the resumed run ends bit for bit where an
uninterrupted one does.

``train_state.pt`` holds only tensors, numbers and strings and is read with
``torch.load(weights_only=True)``: nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from aiayn.atomic import (
    OLD_MARK,
    TMP_MARK,
    begin_folder,
    commit_folder,
    fs_step,
    fsync_path,
    recover,
    write_atomically,
)
from aiayn.checkpoint.bundle import (
    RUN_FILE,
    TOKENIZER_FILE,
    Bundle,
    read_bundle,
    save_bundle,
    write_bundle_files,
)
from aiayn.checkpoint.model import checked_folder, write_config
from aiayn.checkpoint.sharded import check_shards_present, save_sharded
from aiayn.data.tokenizer import Tokenizer
from aiayn.errors import CheckpointError
from aiayn.models import TransformerModel

CHECKPOINT = "checkpoint"
CHECKPOINTS = "checkpoints"
SNAPSHOTS = "snapshots"
LOG_FILE = "log.csv"
STATE_FILE = "train_state.pt"
_STEP_DIR = re.compile(r"^step_(\d+)$")


@dataclass
class TrainState:
    """Everything besides the model that a resumed run needs to continue exactly."""

    step: int
    optimizer: dict[str, Any]
    torch_rng: torch.Tensor
    data: dict[str, Any]  # the task's data position (generator states, epoch, batch index)
    history: list[dict[str, float]] = field(default_factory=list)
    scaler: dict[str, Any] = field(default_factory=dict)  # a float16 GradScaler's state
    cuda_rng: list[torch.Tensor] = field(default_factory=list)  # every GPU's RNG state
    # Kernel choices made at the run's start (e.g. {"linear": "onednn"}): a resumed run keeps
    # them, so that its numerics do not change with a host's speed at the moment of resuming.
    kernels: dict[str, str] = field(default_factory=dict)
    # True when the model and the optimizer are in the folder's dcp/ shards (``optimizer``
    # is then empty): aiayn/checkpoint/sharded.py.
    sharded: bool = False


def step_dir_name(step: int) -> str:
    return f"step_{step:09d}"


def _step_of(path: Path) -> int | None:
    m = _STEP_DIR.match(path.name)
    return int(m.group(1)) if m and path.is_dir() else None


def read_state(folder: Path) -> TrainState:
    path = folder / STATE_FILE
    if not path.is_file():
        raise CheckpointError(f"{folder} holds a model but no {STATE_FILE}: nothing to resume from")
    try:
        raw = torch.load(path, weights_only=True, map_location="cpu")
        return TrainState(**raw)
    except Exception as err:  # unpickling errors, truncation, wrong keys
        raise CheckpointError(f"corrupt training state {path}: {err}") from err


class RunDir:
    """The files of one training run (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.pointer = self.root / CHECKPOINT
        self.checkpoints = self.root / CHECKPOINTS
        self.snapshots = self.root / SNAPSHOTS
        self.log = self.root / LOG_FILE

    # ----- what is there ----------------------------------------------------------------
    def _complete(self) -> list[tuple[int, Path]]:
        if not self.checkpoints.is_dir():
            return []
        found = [(_step_of(p), p) for p in self.checkpoints.iterdir()]
        return sorted((s, p) for s, p in found if s is not None)

    def latest(self) -> Path | None:
        """The newest complete checkpoint folder (after ``recover``), or None."""
        complete = self._complete()
        return complete[-1][1] if complete else None

    def holds_run(self) -> bool:
        """Whether an earlier run left its files here."""
        return bool(
            self._complete()
            or self.pointer.exists()
            or self.pointer.is_symlink()
            or self.log.exists()
            or (self.snapshots.is_dir() and any(self.snapshots.iterdir()))
        )

    # ----- repairs --------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Repair what a kill may have left: adopt a checkpoint folder of the old layout,
        remove temporary folders and links, put back a folder renamed aside while it was being
        replaced, point ``checkpoint`` at the newest complete checkpoint and delete older
        ones.  Returns what was done, for the log.  Call it holding the folder's writer lock
        (aiayn/checkpoint/run_lock.py): it deletes what another writer would be filling."""
        done: list[str] = []
        if not self.root.is_dir():
            return done
        if self.pointer.is_dir() and not self.pointer.is_symlink():  # the layout before 0.2
            step = read_state(self.pointer).step
            self.checkpoints.mkdir(exist_ok=True)
            os.replace(self.pointer, self.checkpoints / step_dir_name(step))
            done.append(f"moved the old-layout checkpoint to {CHECKPOINTS}/")
        for folder in (self.root, self.checkpoints, self.snapshots):
            if not folder.is_dir():
                continue
            for leftover in folder.glob(f".*{TMP_MARK}*"):
                if leftover.is_symlink() or leftover.is_file():
                    leftover.unlink()
                else:
                    shutil.rmtree(leftover, ignore_errors=True)
                done.append(f"removed the unfinished {leftover.name}")
        done += self._put_back_replaced()
        latest = self.latest()
        if latest is not None:
            if os.path.realpath(self.pointer) != os.path.realpath(latest):
                self._point_at(latest)
                done.append(f"pointed {CHECKPOINT} at {latest.name}")
            for _, old in self._complete()[:-1]:
                shutil.rmtree(old, ignore_errors=True)
                done.append(f"removed the older checkpoint {old.name}")
        elif self.pointer.is_symlink():  # a link to nothing
            self.pointer.unlink()
        return done

    def _put_back_replaced(self) -> list[str]:
        """A folder being replaced where ``renameat2(RENAME_EXCHANGE)`` is missing is renamed
        aside (``.NAME.old-PID``) first: put it back if a kill came before the new one took
        its name, else remove it (aiayn/atomic.py)."""
        done: list[str] = []
        for folder in (self.checkpoints, self.snapshots):
            if not folder.is_dir():
                continue
            names = {old.name[1:].split(OLD_MARK)[0] for old in folder.glob(f".*{OLD_MARK}*")}
            for target in sorted(folder / name for name in names):
                missing = not target.exists()
                recover(target)  # puts the folder back where target is missing
                done.append(
                    f"put back {folder.name}/{target.name}, which a kill left renamed aside"
                    if missing and target.exists()
                    else f"removed the replaced copy of {folder.name}/{target.name}"
                )
        return done

    def clear(self) -> None:
        """Remove the files of an earlier run (``--overwrite``); nothing else in the folder."""
        if self.pointer.is_symlink() or self.pointer.is_file():
            self.pointer.unlink()
        for folder in (self.pointer, self.checkpoints, self.snapshots):
            if folder.is_dir():
                shutil.rmtree(folder)
        if self.log.exists():
            self.log.unlink()

    # ----- writing --------------------------------------------------------------------
    def _point_at(self, folder: Path) -> None:
        tmp = self.root / f".{CHECKPOINT}{TMP_MARK}link"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(os.path.relpath(folder, self.root), tmp)
        fs_step("pointer-written")
        os.replace(tmp, self.pointer)  # atomic: the old link or the new one, never neither
        fs_step("pointer-switched")
        fsync_path(self.root)

    def save_checkpoint(
        self,
        model: TransformerModel,
        tokenizer: Tokenizer,
        run: dict[str, Any],
        state: TrainState,
    ) -> Path:
        """Commit a resumable checkpoint at ``state.step`` (see the module docstring)."""
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        target = self.checkpoints / step_dir_name(state.step)

        def fill(tmp: Path) -> None:
            write_bundle_files(tmp, model, tokenizer, run)
            torch.save(asdict(state), tmp / STATE_FILE)

        write_atomically(target, fill)
        self._point_at(target)
        self._remove_older_than(target)
        return target

    def save_sharded_checkpoint(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        tokenizer: Tokenizer,
        run: dict[str, Any],
        state: TrainState,
    ) -> Path:
        """Commit a checkpoint whose model and optimizer every rank writes as its own shard
        (collective: every process calls it; aiayn/checkpoint/sharded.py).  ``state`` and the
        other files come from rank 0, which commits the folder as ``save_checkpoint``."""
        distributed = dist.is_available() and dist.is_initialized()
        rank = dist.get_rank() if distributed else 0
        target = self.checkpoints / step_dir_name(state.step)

        def agree(box: list[Any]) -> list[Any]:
            """Rank 0's values, on every rank (a barrier, too)."""
            if distributed:
                dist.broadcast_object_list(box, src=0)
            return box

        # 1. rank 0 makes the temporary folder; every rank learns its name -- or the error.
        folder = self._begin_on_rank_0(target, rank, agree)
        # 2. every rank writes its shard (collective: a failure there reaches every rank).
        try:
            save_sharded(folder, model, optimizer)
        except BaseException:
            if rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        # 3. rank 0 adds the rest and commits; the others must learn whether it did.
        outcome: list[Any] = [None]
        if rank == 0:
            try:
                write_config(model, folder)  # type: ignore[arg-type]
                tokenizer.save(folder / TOKENIZER_FILE)
                (folder / RUN_FILE).write_text(json.dumps(run, indent=2))
                torch.save(asdict(state), folder / STATE_FILE)
                check_shards_present(folder)
                commit_folder(folder, target)
                self._point_at(target)
            except BaseException as err:
                shutil.rmtree(folder, ignore_errors=True)
                outcome[0] = f"{type(err).__name__}: {err}"
                agree(outcome)
                raise
        # 4. every rank waits for the commit, and fails with rank 0 if it failed.
        (error,) = agree(outcome)
        if error is not None:
            raise OSError(f"rank 0 could not commit the checkpoint {target}: {error}")
        if rank == 0:
            self._remove_older_than(target)
        return target

    def _remove_older_than(self, target: Path) -> None:
        """Remove every complete checkpoint but ``target``, the one just committed."""
        for _, old in self._complete():
            if old != target:
                shutil.rmtree(old, ignore_errors=True)
        fs_step("old-removed")

    def _begin_on_rank_0(
        self, target: Path, rank: int, agree: Callable[[list[Any]], list[Any]]
    ) -> Path:
        """The temporary folder rank 0 made for ``target``, its name told to every rank; an
        OSError on every rank when rank 0 could not make it."""
        made: list[Any] = [None, None]
        if rank == 0:
            try:
                self.checkpoints.mkdir(parents=True, exist_ok=True)
                made[0] = begin_folder(target)
            except Exception as err:
                made[1] = f"{type(err).__name__}: {err}"
        folder, error = agree(made)
        if error is not None:
            raise OSError(f"cannot start the checkpoint {target}: {error}")
        return Path(folder)

    def save_snapshot(
        self, step: int, model: TransformerModel, tokenizer: Tokenizer, run: dict[str, Any]
    ) -> Path:
        """A model-only copy for checkpoint averaging."""
        return save_bundle(self.snapshots / step_dir_name(step), model, tokenizer, run)

    def snapshot_dirs(self) -> list[Path]:
        if not self.snapshots.is_dir():
            return []
        found = [(_step_of(p), p) for p in self.snapshots.iterdir()]
        return [p for s, p in sorted((s, p) for s, p in found if s is not None)]

    # ----- reading --------------------------------------------------------------------
    def load(self, *, weights: bool = True) -> tuple[Bundle, TrainState]:
        """The latest checkpoint's model, tokenizer, run config and training state; with
        ``weights=False`` a sharded checkpoint's model is built but not filled (see
        ``read_bundle``)."""
        latest = self.latest()
        if latest is None:
            raise CheckpointError(f"{self.root} holds no checkpoint")
        checked_folder(latest, "checkpoint")  # the manifest first: it names a damaged file
        state = read_state(latest)
        return read_bundle(latest, weights=weights or not state.sharded, verified=True), state
