"""Reading torch.distributed.checkpoint's files without running what they name.

DCP writes its ``.metadata`` with ``pickle``, and reads it back with ``pickle.load``;
non-tensor values (an optimizer's hyperparameters) it reads with a full ``torch.load``, objects
and all.  Unpickling calls whatever a file names, so a folder from elsewhere with
a crafted ``dcp/.metadata`` would run its code the moment aiayn opened it.  Here both are read
the safe way:

* ``MetadataReader`` unpickles ``.metadata`` through ``_MetadataUnpickler``, which
  admits only the classes DCP's metadata is made of (its dataclasses, ``torch.Size``, dtypes,
  the layout and memory-format encodings, paths) and refuses anything else before it runs;
* ``Planner`` reads non-tensor values with ``torch.load(weights_only=True)``: numbers,
  strings and containers of them, never an object.

Pass both to ``dcp.load`` (``aiayn.checkpoint.sharded.load_sharded`` does).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from aiayn.atomic import inside
from aiayn.errors import CheckpointError

METADATA_FILE = ".metadata"

# (module, name) of every class a DCP .metadata file is made of (torch 2.5 to 2.13).
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "ChunkStorageMetadata",
        "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles only what DCP's metadata holds: any other global a file names -- a function to
    call, a class from elsewhere -- is refused before it is looked up, let alone called."""

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in _ALLOWED or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"{module}.{name} is not part of a DCP checkpoint's metadata: refused, not run"
        )


def read_metadata(folder: Path) -> Metadata:
    """``folder``'s DCP metadata (``folder/.metadata``), unpickled safely.  Raises ValueError
    naming the file when it holds anything else."""
    path = folder / METADATA_FILE
    try:
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path} is not DCP metadata: {err}") from err
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path} is not DCP metadata: it holds a {type(metadata).__name__}")
    return metadata


def shard_files(folder: Path, metadata: Metadata) -> list[Path]:
    """The shard files ``metadata`` names (its items' ``relative_path``), each a plain file name
    inside ``folder``: ``..``, an absolute path, a subfolder or a symbolic link out of it is a
    ValueError naming ``.metadata`` and the name."""
    storage = metadata.storage_data
    if storage is None:
        return []
    where = str(folder / METADATA_FILE)
    if not isinstance(storage, dict):
        raise CheckpointError(
            f"{where}: storage_data is a {type(storage).__name__}; expected a dict"
        )
    names = {getattr(item, "relative_path", None) for item in storage.values()}
    return [inside(folder, name, where, flat=True) for name in sorted(names, key=repr)]


class MetadataReader(FileSystemReader):
    """DCP's file-system reader, with ``.metadata`` read by ``read_metadata``, and every
    shard file it names a plain file name inside the folder (``shard_files``)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointError("per-rank DCP metadata files are not read: aiayn writes one")
        folder = Path(self.path)
        metadata = read_metadata(folder)
        shard_files(folder, metadata)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # type: ignore[union-attr]
        return metadata


class Planner(DefaultLoadPlanner):
    """DCP's load planner, with non-tensor values read as weights only (no objects)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
