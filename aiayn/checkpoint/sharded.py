"""Sharded checkpoints: every process writes its own shard (torch.distributed.checkpoint).

A run sharded with FSDP2 need not gather its weights and optimizer moments into one process
to save them.  With ``train.checkpoint_format = "sharded"`` (the default, ``"auto"``, picks it
whenever the model is sharded) a checkpoint folder holds::

    config.json, tokenizer.json, run.json, train_state.pt   written by rank 0, as always
    dcp/.metadata, dcp/__R_0.distcp                          the model and the optimizer,
                                                             each rank's shard in its own file

DCP records which slice of every tensor each file holds, so the folder loads on any number of
processes -- one process reads whole tensors, N processes read their new shards -- and on any
device.  The folder is committed like any other (aiayn/atomic.py): rank 0 makes the
temporary folder, every rank writes its shard into it, rank 0 adds the rest and the manifest
(which covers the shards) and renames it into place.

Generation, evaluation and the explorer load a sharded checkpoint like a full one
(``load_model_weights``, one process, no process group).  DCP's pickled files are read
through aiayn/checkpoint/dcp_safe.py, which runs nothing a folder from elsewhere names.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from aiayn.errors import CheckpointError

# torch.distributed.checkpoint is imported by the functions that use it: it costs more than a
# second at start-up, and a command that loads a plain checkpoint never needs it.

SHARDED_DIR = "dcp"
_METADATA = ".metadata"


def is_sharded_checkpoint(folder: Path) -> bool:
    return (folder / SHARDED_DIR / _METADATA).is_file()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns that it assumes a single process when there is no process group: here that
    is the intent, not an accident."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write the model and the optimizer's state into ``folder/dcp`` (collective: every rank
    calls it with the same ``folder``)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }
    with _quiet_single_process():
        dcp.save(state, checkpoint_id=folder / SHARDED_DIR, no_dist=not _distributed())


def check_shards_present(folder: Path) -> None:
    """Raise OSError unless every shard file DCP's metadata names is in ``folder/dcp`` -- on
    machines that do not share the run folder, another node's shard would be missing -- and
    ValueError for a name that is not a plain file name inside it (``shard_files``)."""
    from aiayn.checkpoint.dcp_safe import read_metadata, shard_files

    shards = folder / SHARDED_DIR
    missing = [p.name for p in shard_files(shards, read_metadata(shards)) if not p.is_file()]
    if missing:
        raise OSError(
            f"shard file(s) {missing} were not written to {shards}: every process must write"
            " into the same run folder (a file system all machines share)"
        )


def _load(folder: Path, state: dict[str, Any], *, no_dist: bool) -> None:
    import torch.distributed.checkpoint as dcp

    from aiayn.checkpoint.dcp_safe import MetadataReader, Planner

    try:
        with _quiet_single_process():
            reader = MetadataReader(folder / SHARDED_DIR)
            dcp.load(state, storage_reader=reader, planner=Planner(), no_dist=no_dist)
    except dcp.CheckpointException as err:  # a BaseException, each rank's error and traceback
        reasons = "; ".join(f"{type(e).__name__}: {e}" for e, _ in err.failures.values())
        raise CheckpointError(
            f"cannot load the sharded checkpoint {folder / SHARDED_DIR}: {reasons}"
        ) from err
    except Exception as err:  # a missing or damaged shard, or tensors the model lacks
        raise CheckpointError(
            f"cannot load the sharded checkpoint {folder / SHARDED_DIR}: {err}"
        ) from err


def load_model_weights(folder: Path, model: nn.Module) -> None:
    """Fill an unsharded ``model`` from a sharded checkpoint, in this process alone."""
    state = {"model": model.state_dict()}
    _load(folder, state, no_dist=True)
    model.load_state_dict(state["model"])


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore the model and the optimizer from ``folder/dcp`` into this run's layout,
    whatever the number of processes that wrote it (collective when distributed)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    weights, moments = get_model_state_dict(model), get_optimizer_state_dict(model, optimizer)
    _load(folder, {"model": weights, "optim": moments}, no_dist=not _distributed())  # in place
    set_model_state_dict(model, weights)
    set_optimizer_state_dict(model, optimizer, moments)
