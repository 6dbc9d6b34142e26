"""A sharded checkpoint's pickled files run nothing: a canary pickle in ``dcp/.metadata`` of a
copied checkpoint (the attack: delete the manifest, write the pickle) is refused by ``load``,
``generate`` and ``serve`` before it runs, and a real sharded checkpoint still loads and
resumes (tests/train/test_faults.py resumes them, optimizer state included)."""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

import aiayn
from aiayn.checkpoint.dcp_safe import Planner, read_metadata
from aiayn.cli import main
from tests.conftest import LM_TEXT, LM_TOML


class Canary:
    """Unpickled, it would create the file ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.path}",)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint written with checkpoint_format = "sharded" (dcp/, no model.safetensors)."""
    root = tmp_path_factory.mktemp("sharded")
    (root / "corpus.txt").write_text(LM_TEXT)
    (root / "run.toml").write_text(LM_TOML)
    argv = ["train", str(root / "run.toml"), "--out", str(root / "run"), "--data", str(root)]
    assert main([*argv, "--set", "train.checkpoint_format=sharded", "train.max_steps=2"]) == 0
    folder = (root / "run" / "checkpoint").resolve()
    assert (folder / "dcp" / ".metadata").is_file() and not (folder / "model.safetensors").exists()
    return folder


def test_a_real_sharded_checkpoint_loads(sharded: Path) -> None:
    """The allow-list holds everything DCP's own metadata is made of."""
    assert read_metadata(sharded / "dcp").state_dict_metadata
    assert isinstance(aiayn.load(sharded).model, aiayn.DecoderLM)


def test_a_pickle_in_the_metadata_never_runs(
    sharded: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiayn.serve import server

    canary = tmp_path / "canary"
    copy = tmp_path / "copy"
    shutil.copytree(sharded, copy)
    (copy / "manifest.json").unlink()
    (copy / "dcp" / ".metadata").write_bytes(pickle.dumps(Canary(canary)))
    with pytest.raises(ValueError, match="posix.system is not part of a DCP checkpoint"):
        aiayn.load(copy)
    monkeypatch.setattr(server, "run_server", lambda app, **kw: None)
    for command in (["generate", "--prompt", "To"], ["serve"]):
        assert main([command[0], "--checkpoint", str(copy), *command[1:]]) == 2
    assert not canary.exists()
    pickle.loads((copy / "dcp" / ".metadata").read_bytes())  # the canary does fire, unchecked
    assert canary.exists()


def test_non_tensor_values_are_read_as_weights_only(tmp_path: Path) -> None:
    """DCP's own planner reads a non-tensor value with weights_only=False: ours refuses an
    object in it."""
    canary = tmp_path / "canary"
    planner, state = Planner(), {"step": 0}
    planner.set_up_planner(state, None, True)  # type: ignore[arg-type]
    index, nowhere = MetadataIndex("step"), torch.Size([0])
    item = ReadItem(LoadItemType.BYTE_IO, index, nowhere, index, nowhere, nowhere)
    planner.load_bytes(item, io.BytesIO(_saved(7)))  # a number: read
    assert state["step"] == 7
    with pytest.raises(pickle.UnpicklingError):
        planner.load_bytes(item, io.BytesIO(_saved(Canary(canary))))
    assert not canary.exists()


def _saved(value: object) -> bytes:
    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()
