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
from aiayn.train.config import load_run_config
from aiayn.train.lm import train_lm
from tests.train.test_lm_training import TOML


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "corpus.txt").write_text("To be, or not to be, that is the question.\n" * 40)
    (tmp_path / "run.toml").write_text(TOML)
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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_port", str(29700 + n),
           "-m", "aiayn", "train", str(cfg), "--out", str(root / out), "--data", str(root), *extra]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


def losses(root: Path, out: str) -> list[float]:
    rows = (root / out / "log.csv").read_text().splitlines()[1:]
    return [float(r.split(",")[1]) for r in rows]


def test_fsdp_matches_one_process_and_resumes_on_another_count(setup: tuple[Path, Path]) -> None:
    """Four steps on 2 FSDP processes equal four on one process (with twice the gradient
    accumulation); then both runs are resumed by a single process to step 8, the sharded one
    from its gathered checkpoint, and still agree."""
    root, cfg = setup
    common = ["--set", "model.dropout=0.0", "train.threads=1"]
    one = torchrun(1, root, cfg, "one", *common, "train.grad_accum=2", "train.max_steps=4")
    assert one.returncode == 0, one.stderr[-3000:]
    two = torchrun(2, root, cfg, "fsdp", *common, "train.parallel=fsdp", "train.grad_accum=1",
                   "train.max_steps=4")  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    assert losses(root, "fsdp") == pytest.approx(losses(root, "one"), rel=1e-4)
    for out in ("one", "fsdp"):
        more = torchrun(1, root, cfg, out, *common, "train.grad_accum=2", "train.max_steps=8",
                        "--resume")  # fmt: skip
        assert more.returncode == 0, more.stderr[-3000:]
    assert len(losses(root, "fsdp")) == 8
    assert losses(root, "fsdp") == pytest.approx(losses(root, "one"), rel=1e-4)
    a, _ = RunDir(root / "one").load()
    b, _ = RunDir(root / "fsdp").load()
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=name)
