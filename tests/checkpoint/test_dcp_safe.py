"""A sharded checkpoint's pickled files run nothing: a canary pickle in ``dcp/.metadata`` of a
copied checkpoint (the attack: delete the manifest, write the pickle) is refused by ``load``,
``generate`` and ``serve`` before it runs, and a real sharded checkpoint still loads and
resumes (tests/training/test_faults.py resumes them, optimizer state included)."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

import aiayn
from aiayn.checkpoint.dcp_safe import Planner, read_metadata
from aiayn.checkpoint.sharded import check_shards_present
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


def hostile_copy(sharded: Path, to: Path, canary: Path) -> Path:
    """The attack: a copy of a real sharded checkpoint, its manifest deleted and a canary
    pickle written into ``dcp/.metadata``."""
    shutil.copytree(sharded, to)
    (to / "manifest.json").unlink()
    (to / "dcp" / ".metadata").write_bytes(pickle.dumps(Canary(canary)))
    return to


def _train_from(folder: Path, tmp_path: Path) -> int:
    """``aiayn train`` of a run that starts from ``folder`` (``[model] init_from``)."""
    (tmp_path / "corpus.txt").write_text(LM_TEXT)
    toml = f'[model]\ninit_from = "{folder}"\n\n' + LM_TOML[LM_TOML.index("[data]") :]
    (tmp_path / "tune.toml").write_text(toml)
    argv = ["train", str(tmp_path / "tune.toml"), "--out", str(tmp_path / "tuned")]
    return main([*argv, "--data", str(tmp_path)])


def _resume(sharded: Path, tmp_path: Path, canary: Path) -> int:
    """``aiayn train --resume`` of a copied run whose latest checkpoint is hostile."""
    run = tmp_path / "run"
    shutil.copytree(sharded.parent.parent, run, symlinks=True)  # RUN/checkpoints/step_N
    checkpoint = (run / "checkpoint").resolve()
    assert checkpoint.is_relative_to(run.resolve()), "the copy must not point at the original"
    (checkpoint / "manifest.json").unlink()
    (checkpoint / "dcp" / ".metadata").write_bytes(pickle.dumps(Canary(canary)))
    (tmp_path / "corpus.txt").write_text(LM_TEXT)
    (tmp_path / "run.toml").write_text(LM_TOML)
    argv = ["train", str(tmp_path / "run.toml"), "--out", str(run), "--data", str(tmp_path)]
    return main([*argv, "--resume", "--set", "train.checkpoint_format=sharded"])


def _explore(folder: Path) -> None:
    from aiayn.explore.registry import Registry

    registry = Registry()
    registry.get(registry.add_checkpoint(folder))


PATHS = ["load", "generate", "serve", "embed", "translate", "explore", "init_from", "resume"]


@pytest.mark.parametrize("path", PATHS)
def test_a_pickle_in_the_metadata_never_runs(
    path: str,
    sharded: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every way a folder is opened refuses the canary before it runs: a clear error (exit 2
    from the command line), and no file created."""
    from aiayn.serve import server

    canary = tmp_path / "canary"
    copy = hostile_copy(sharded, tmp_path / "copy", canary)
    monkeypatch.setattr(server, "run_server", lambda app, **kw: None)
    commands = {
        "generate": ["generate", "--checkpoint", str(copy), "--prompt", "To"],
        "serve": ["serve", "--checkpoint", str(copy)],
        "embed": ["embed", "--checkpoint", str(copy)],
        "translate": ["translate", "--checkpoint", str(copy)],
    }
    refused = "posix.system is not part of a DCP checkpoint"
    if path in ("load", "explore"):
        with pytest.raises(ValueError, match=refused):
            aiayn.load(copy) if path == "load" else _explore(copy)
    else:
        if path in commands:
            code = main(commands[path])
        else:
            code = (
                _train_from(copy, tmp_path)
                if path == "init_from"
                else _resume(sharded, tmp_path, canary)
            )
        assert code == 2 and refused in capsys.readouterr().err
    assert not canary.exists()


def test_the_canary_does_fire_when_unpickled_unchecked(sharded: Path, tmp_path: Path) -> None:
    """The attack is real: the same file, read with pickle, creates the canary."""
    canary = tmp_path / "canary"
    copy = hostile_copy(sharded, tmp_path / "copy", canary)
    pickle.loads((copy / "dcp" / ".metadata").read_bytes())
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


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../outside.distcp", "is not a file inside"),
        ("ABSOLUTE", "is not a file inside"),
        ("sub/__0_0.distcp", "is not a plain file name in"),
        ("link.distcp", r"leads out of .* \(a symbolic link\)"),
    ],
)
def test_a_shard_file_outside_dcp_is_refused(
    sharded: Path, tmp_path: Path, name: str, why: str
) -> None:
    """Metadata whose items name a shard file outside ``dcp/`` (its manifest deleted): the
    presence check and loading refuse the name before any file is opened."""
    copy = tmp_path / "copy"
    shutil.copytree(sharded, copy)
    (copy / "manifest.json").unlink()
    shards = copy / "dcp"
    outside = tmp_path / "outside.distcp"
    shutil.copy(next(shards.glob("*.distcp")), outside)
    (shards / "link.distcp").symlink_to(outside)
    name = str(outside) if name == "ABSOLUTE" else name
    metadata = read_metadata(shards)
    for key, item in metadata.storage_data.items():
        metadata.storage_data[key] = dataclasses.replace(item, relative_path=name)
    (shards / ".metadata").write_bytes(pickle.dumps(metadata))
    refused = f"dcp/.metadata: {re.escape(repr(name))} {why}"
    with pytest.raises(ValueError, match=refused):
        check_shards_present(copy)
    with pytest.raises(ValueError, match=refused):
        aiayn.load(copy)
