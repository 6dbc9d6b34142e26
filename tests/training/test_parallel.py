"""Precision and parallelism on the CPU: bf16 and fp16 autocast training, FSDP2 over two gloo
processes matching one process, and a sharded run resumed on another number of processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import RunDir
from aiayn.cli import main
from aiayn.training.config import load_run_config
from aiayn.training.lm import train_lm
from tests.conftest import LM_TEXT, LM_TOML, free_port


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "corpus.txt").write_text(LM_TEXT)
    (tmp_path / "run.toml").write_text(LM_TOML)
    return tmp_path, tmp_path / "run.toml"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_training_learns_and_keeps_fp32_weights(
    setup: tuple[Path, Path], dtype: str
) -> None:
    root, cfg = setup
    run = load_run_config(cfg, {"train.dtype": dtype, "train.max_steps": 12, "model.dropout": 0.0})
    result = train_lm(run, root / dtype, root, progress=False)
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0] and all(torch.isfinite(torch.tensor(losses)))
    bundle, state = RunDir(root / dtype).load()
    assert all(p.dtype == torch.float32 for p in bundle.model.parameters())
    assert bool(state.scaler) == (dtype == "float16")  # the scaler's state is checkpointed


def torchrun(
    n: int, root: Path, cfg: Path, out: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(n),
        "--master_port",
        str(free_port()),
        "-m",
        "aiayn",
        "train",
        str(cfg),
        "--out",
        str(root / out),
        "--data",
        str(root),
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


def here(root: Path, cfg: Path, out: str, *extra: str) -> int:
    """``aiayn train`` as one process: this one (torchrun's single process is the same run)."""
    return main(["train", str(cfg), "--out", str(root / out), "--data", str(root), *extra])


def losses(root: Path, out: str) -> list[float]:
    rows = (root / out / "log.csv").read_text().splitlines()[1:]
    return [float(r.split(",")[1]) for r in rows]


def shard_files(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "dcp").glob("*.distcp"))


@pytest.mark.slow
def test_fsdp_matches_one_process_and_resumes_on_another_count(setup: tuple[Path, Path]) -> None:
    """Four steps on 2 FSDP processes (torchrun) equal four on one process (with twice the gradient
    accumulation).  The FSDP run's checkpoint is sharded (each rank writes its own file);
    the single process's is full.  Then each is resumed on the other count to step 8 -- the
    sharded one by one process that writes shards of its own, the full one by two FSDP
    processes that write two shards -- and the two runs still agree, step for step and in
    their final weights, read back from shards by one process."""
    root, cfg = setup
    common = ["--set", "model.dropout=0.0", "train.threads=1"]
    one = ["train.grad_accum=2", "train.max_steps=4"]
    assert here(root, cfg, "one", *common, *one) == 0
    two = torchrun(
        2,
        root,
        cfg,
        "fsdp",
        *common,
        "train.parallel=fsdp",
        "train.grad_accum=1",
        "train.max_steps=4",
    )
    assert two.returncode == 0, two.stderr[-3000:]
    # the gradients reduced across processes: a sum in another order, its rounding grown
    # through the steps (fp32, 2^-23 relative per operation)
    assert losses(root, "fsdp") == pytest.approx(losses(root, "one"), rel=1e-4)
    sharded = RunDir(root / "fsdp").latest()
    assert sharded is not None and not (sharded / "model.safetensors").exists()
    assert shard_files(sharded) == ["__0_0.distcp", "__1_0.distcp"]
    manifest = (sharded / "manifest.json").read_text()
    assert "dcp/__1_0.distcp" in manifest and "dcp/.metadata" in manifest
    assert (RunDir(root / "one").latest() / "model.safetensors").is_file()  # type: ignore[operator]

    more = ["train.grad_accum=2", "train.max_steps=8", "train.checkpoint_format=sharded"]
    assert here(root, cfg, "fsdp", *common, *more, "--resume") == 0
    more_one = torchrun(
        2,
        root,
        cfg,
        "one",
        *common,
        "train.parallel=fsdp",
        "train.grad_accum=1",
        "train.max_steps=8",
        "--resume",
    )
    assert more_one.returncode == 0, more_one.stderr[-3000:]
    assert len(losses(root, "fsdp")) == 8
    # the gradients reduced across processes: a sum in another order, its rounding grown
    # through the steps (fp32, 2^-23 relative per operation)
    assert losses(root, "fsdp") == pytest.approx(losses(root, "one"), rel=1e-4)
    assert shard_files(RunDir(root / "fsdp").latest()) == ["__0_0.distcp"]  # type: ignore[arg-type]
    assert shard_files(RunDir(root / "one").latest()) == ["__0_0.distcp", "__1_0.distcp"]  # type: ignore[arg-type]
    a, _ = RunDir(root / "one").load()
    b, _ = RunDir(root / "fsdp").load()
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=name)  # (as above)


def test_sharded_checkpoint_in_one_process_and_a_damaged_shard_is_named(
    setup: tuple[Path, Path],
) -> None:
    """One process writes a sharded checkpoint whose weights read back equal the full
    checkpoint's of the same run; a shard altered after the commit fails the manifest check
    with the file's name, instead of loading wrong weights."""
    root, cfg = setup
    run = load_run_config(
        cfg, {"train.max_steps": 2, "train.checkpoint_format": "sharded", "model.dropout": 0.0}
    )
    train_lm(run, root / "s", root, progress=False)
    full = load_run_config(
        cfg, {"train.max_steps": 2, "train.checkpoint_format": "full", "model.dropout": 0.0}
    )
    train_lm(full, root / "f", root, progress=False)
    folder = RunDir(root / "s").latest()
    assert folder is not None and shard_files(folder) == ["__0_0.distcp"]
    bundle, state = RunDir(root / "s").load()  # one process reads its own shards back
    assert state.sharded and state.optimizer == {}
    reference, _ = RunDir(root / "f").load()
    for (name, p), q in zip(
        bundle.model.named_parameters(), reference.model.parameters(), strict=True
    ):
        torch.testing.assert_close(p, q, atol=0, rtol=0, msg=name)  # the same numbers, resharded
    shard = folder / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="__0_0.distcp is corrupt"):
        RunDir(root / "s").load()
