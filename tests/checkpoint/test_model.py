from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aiayn


@pytest.mark.parametrize("preset", ["paper-base", "gpt2-small", "llama-style-small", "bert-base"])
def test_save_load_identical_outputs(tmp_path: Path, preset: str) -> None:
    torch.manual_seed(0)
    model = aiayn.build_model(
        preset,
        n_layers=1,
        d_model=32,
        attention={"n_heads": 4},
        ffn={"d_ff": 48},
        vocab_size=64,
        max_len=16,
        dropout=0.0,
    ).eval()
    with torch.no_grad():  # move off the initial values so that a missed tensor shows
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    aiayn.save(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
    ]
    loaded = aiayn.load_model(tmp_path / "m").eval()
    assert loaded.config == model.config
    ids = torch.randint(1, 64, (2, 7))
    args = (ids, ids[:, :5]) if preset == "paper-base" else (ids,)
    # the same weights through the same kernels: bit for bit
    torch.testing.assert_close(loaded(*args), model(*args), atol=0, rtol=0)
    assert loaded.num_parameters() == model.num_parameters()  # tying survives the round trip


def test_overwrite_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    model = aiayn.build_model(
        "gpt2-small",
        n_layers=1,
        d_model=16,
        attention={"n_heads": 2},
        ffn={"d_ff": 16},
        vocab_size=32,
        max_len=8,
    )
    aiayn.save(model, tmp_path / "m")
    aiayn.save(model, tmp_path / "m")
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_failed_save_keeps_old_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = aiayn.build_model(
        "gpt2-small",
        n_layers=1,
        d_model=16,
        attention={"n_heads": 2},
        ffn={"d_ff": 16},
        vocab_size=32,
        max_len=8,
    )
    aiayn.save(model, tmp_path / "m")
    before = (tmp_path / "m" / "model.safetensors").read_bytes()

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("aiayn.checkpoint.model.save_model", boom)
    with pytest.raises(OSError, match="disk full"):
        aiayn.save(model, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_missing_and_corrupt_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a folder"):
        aiayn.load_model(tmp_path / "nope")
    model = aiayn.build_model(
        "gpt2-small",
        n_layers=1,
        d_model=16,
        attention={"n_heads": 2},
        ffn={"d_ff": 16},
        vocab_size=32,
        max_len=8,
    )
    path = aiayn.save(model, tmp_path / "m")
    weights = path / "model.safetensors"
    intact = weights.read_bytes()
    weights.write_bytes(intact[:100])
    with pytest.raises(ValueError, match="model.safetensors is truncated"):
        aiayn.load_model(path)
    flipped = bytearray(intact)
    flipped[-5] ^= 0xFF  # same size, one byte altered: only the checksum can tell
    weights.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="model.safetensors is corrupt"):
        aiayn.load_model(path)
    (path / "manifest.json").unlink()  # a folder of an older aiayn: no manifest
    weights.write_bytes(intact[:100])
    with pytest.raises(ValueError, match="corrupt weights"):
        aiayn.load_model(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt model config"):
        aiayn.load_model(path)
    (path / "config.json").unlink()
    with pytest.raises(ValueError, match="config.json is missing"):
        aiayn.load_model(path)


def test_weights_of_another_shape_are_refused(tmp_path: Path) -> None:
    small = aiayn.build_model(
        "gpt2-small",
        n_layers=1,
        d_model=16,
        attention={"n_heads": 2},
        ffn={"d_ff": 16},
        vocab_size=32,
        max_len=8,
    )
    other = aiayn.build_model(
        "gpt2-small",
        n_layers=2,
        d_model=16,
        attention={"n_heads": 2},
        ffn={"d_ff": 16},
        vocab_size=32,
        max_len=8,
    )
    aiayn.save(small, tmp_path / "a")
    aiayn.save(other, tmp_path / "b")
    (tmp_path / "a" / "model.safetensors").write_bytes(
        (tmp_path / "b" / "model.safetensors").read_bytes()
    )
    (tmp_path / "a" / "manifest.json").unlink()  # as if copied in by hand
    with pytest.raises(ValueError, match="do not match the config"):
        aiayn.load_model(tmp_path / "a")
