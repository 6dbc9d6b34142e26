"""--resume continues bit for bit, for every task and precision.

The README promises that a resumed run has "the same batches, dropout masks and learning rates,
and the same final weights bit for bit as a run that never stopped".  Each case here trains a
tiny model N steps in one go and, separately, k steps (the loop's planned stop,
``stop_after``), then resumes the second run to N; the two must end with equal weights
(``torch.equal``, not a tolerance), equal optimizer moments, RNG, data position and gradient
scaler, and the same per-step losses and learning rates.  Dropout is on wherever the model has
it, so that a lost RNG state shows.  The cases cover what the character-level LM of
tests/training/test_faults.py does not: translation with token-count batches stopped on and just
past an epoch boundary, the Vision Transformer across an epoch, the recurrent encoder-decoder,
and bf16 and fp16 autocast (fp16 with its GradScaler, whose scale must have moved).

Everything runs on the CPU with the MKL linear kernel fixed, so that no timing (the
oneDNN/MKL probe) and no GPU's non-deterministic kernels enter the comparison.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from aiayn.checkpoint import RunDir
from aiayn.checkpoint.run_dir import TrainState
from aiayn.cli import main
from aiayn.config.run import RunConfig
from aiayn.data.batching import token_batches
from aiayn.data.tokenizer import BPETokenizer
from aiayn.training.config import load_run_config
from aiayn.training.lm import train_lm
from aiayn.training.loop import FitResult
from aiayn.training.translate import encode_pairs, load_pairs, train_translation
from aiayn.training.vision import train_vision
from tests.conftest import LM_TEXT, TRANSLATION_TOML, write_corpus

Train = Callable[..., FitResult]  # train_lm, train_translation, train_vision

# Every run: the CPU, the MKL kernel (never timed), the default fp32 unless a case says.
PINNED = {"train.device": "cpu", "train.linear_kernel": "mkl"}

LM_TOML = """
[model]
preset = "gpt2-small"
n_layers = 1
d_model = 32
attention.n_heads = 4
ffn.d_ff = 64
max_len = 16
dropout = 0.1

[data]
text = "corpus.txt"

[train]
max_steps = 8
batch_size = 4
block_size = 16
lr = 3e-3
warmup_steps = 2
eval_interval = 4
eval_batches = 2
checkpoint_interval = 4
"""

VIT_TOML = """
[model]
arch = "encoder"
vision.patch_size = 2
vision.pool = "cls"
positions.scheme = "learned"
n_layers = 1
d_model = 16
attention.n_heads = 2
ffn.d_ff = 32
norm_position = "pre"
ffn.activation = "gelu"
dropout = 0.1
init = "scaled-normal"
scale_embeddings = false
tie_embeddings = false
vocab_size = 10

[data]
images = "digits"
test_fraction = 0.45       # 889 training images left: 4 batches an epoch, the last of 121

[train]
max_steps = 6
batch_size = 256
lr = 3e-3
warmup_steps = 2
label_smoothing = 0.1
eval_interval = 3
checkpoint_interval = 3
seed = 1
"""


def lm_case(root: Path, dtype: str = "float32") -> tuple[RunConfig, Path]:
    """A character-level LM with dropout, its config and data folder."""
    (root / "corpus.txt").write_text(LM_TEXT)
    (root / "run.toml").write_text(LM_TOML)
    return load_run_config(root / "run.toml", {**PINNED, "train.dtype": dtype}), root


def translation_case(root: Path, rnn: str | None = None, steps: int = 10) -> tuple[RunConfig, Path]:
    """The encoder-decoder (or a recurrent one) of tests/training/test_translation.py, with
    dropout and token-count batches of 128 tokens, for ``steps`` steps."""
    write_corpus(root / "data")
    toml = TRANSLATION_TOML
    if rnn is not None:
        toml = toml.replace('preset = "paper-base"', f'preset = "paper-base"\nrnn.cell = "{rnn}"')
    (root / "run.toml").write_text(toml)
    settings = {
        **PINNED,
        "train.keep_snapshots": 0,
        "train.max_steps": steps,
        "train.max_tokens": 128,
    }
    return load_run_config(root / "run.toml", settings), root / "data"


def batches_per_epoch(run: RunConfig, data: Path, run_dir: Path) -> int:
    """How many token-count batches the translation task draws per epoch, with the tokenizer
    that the run in ``run_dir`` saved (its BPE is trained once, at the start)."""
    tokenizer = RunDir(run_dir).load()[0].tokenizer
    assert isinstance(tokenizer, BPETokenizer)
    examples = encode_pairs(load_pairs(run, data, "train"), tokenizer)
    lengths = [(len(s), len(t) - 1) for s, t in examples]  # as TranslationTask counts them
    return len(token_batches(lengths, run.train.max_tokens or 0, seed=run.train.seed, epoch=0))


def train_split(
    train: Train, run: RunConfig, data: Path, root: Path, stop: int, name: str = "split"
) -> TrainState:
    """Train ``root/name`` to step ``stop``, then resume it to the end; the state at the stop."""
    train(run, root / name, data, stop_after=stop, progress=False)
    _, at_stop = RunDir(root / name).load()
    assert at_stop.step == stop, f"the planned stop left a checkpoint at {at_stop.step}"
    resumed = train(run, root / name, data, resume=True, progress=False)
    assert resumed.step == run.train.max_steps
    return at_stop


def assert_tensors_equal(a: Any, b: Any, where: str) -> None:
    """``a`` and ``b`` (nested dicts, lists, tensors, numbers) are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{where}: a tensor against {type(b).__name__}"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{list(a.shape)}"
        assert torch.equal(a, b), f"{where} differs (max |diff| {(a - b).abs().max().item()})"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys differ"
        for key in a:
            assert_tensors_equal(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tensors_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def log_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "log.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def assert_same_end(root: Path, stop: int, name: str = "split") -> None:
    """``root/name`` (stopped at ``stop`` and resumed) ended exactly where ``root/full`` did:
    weights, optimizer state, RNG, data position, scaler, history and log rows."""
    full_dir, split_dir = root / "full", root / name
    weights = load_file(str(full_dir / "checkpoint" / "model.safetensors"))
    resumed = load_file(str(split_dir / "checkpoint" / "model.safetensors"))
    assert_tensors_equal(weights, resumed, "model.safetensors")
    (_, full), (_, split) = RunDir(full_dir).load(), RunDir(split_dir).load()
    assert split.step == full.step
    assert_tensors_equal(full.optimizer, split.optimizer, "optimizer")
    assert_tensors_equal(full.torch_rng, split.torch_rng, "torch RNG state")
    assert_tensors_equal(full.data, split.data, "data position")
    assert_tensors_equal(full.scaler, split.scaler, "GradScaler state")
    assert full.kernels == split.kernels == {"linear": "mkl"}
    # Every step's loss and learning rate at full precision; validation losses where the
    # uninterrupted run evaluated (the planned stop adds one evaluation, at ``stop``).
    assert len(split.history) == len(full.history) == full.step
    for a, b in zip(full.history, split.history, strict=True):
        assert (b["step"], b["loss"], b["lr"]) == (a["step"], a["loss"], a["lr"]), (a, b)
        extra_eval = b["step"] == stop and "val_loss" in b and "val_loss" not in a
        assert a.get("val_loss") == b.get("val_loss") or extra_eval, (a, b)
    # log.csv: every step once, the same losses and learning rates as written.
    full_log, split_log = log_rows(full_dir), log_rows(split_dir)
    assert [r["step"] for r in split_log] == [str(s) for s in range(1, full.step + 1)]
    assert [(r["loss"], r["lr"]) for r in split_log] == [(r["loss"], r["lr"]) for r in full_log]


def test_language_model_stopped_between_evaluations(tmp_path: Path) -> None:
    """Stopped at step 5 (evaluations and checkpoints fall at 4 and 8): the extra evaluation
    at the stop must not move the data generator or the dropout RNG."""
    run, data = lm_case(tmp_path)
    train_lm(run, tmp_path / "full", data, progress=False)
    train_split(train_lm, run, data, tmp_path, stop=5)
    assert_same_end(tmp_path, stop=5)


def test_translation_across_an_epoch_boundary(tmp_path: Path) -> None:
    """Token-count batches, stopped exactly at the end of the first epoch (the next batch
    starts epoch 1 lazily), and, in another run, one step into the second epoch."""
    run, data = translation_case(tmp_path)
    train_translation(run, tmp_path / "full", data, progress=False)
    per_epoch = batches_per_epoch(run, data, tmp_path / "full")
    assert 2 <= per_epoch < run.train.max_steps - 1, f"{per_epoch} batches an epoch"
    assert RunDir(tmp_path / "full").load()[1].data["epoch"] >= 1  # the run crossed it
    for past, position in ((0, {"epoch": 0, "index": per_epoch}), (1, {"epoch": 1, "index": 1})):
        name = f"split+{past}"
        at_stop = train_split(train_translation, run, data, tmp_path, per_epoch + past, name)
        assert at_stop.data == position
        assert_same_end(tmp_path, per_epoch + past, name)


def preprocess(root: Path, data: Path) -> None:
    """``aiayn preprocess`` of the run config ``root/run.toml`` into ``data/shards``."""
    made = main(
        [
            "preprocess",
            str(root / "run.toml"),
            "--data",
            str(data),
            "--out",
            str(data / "shards"),
            "--workers",
            "1",
        ]
    )
    assert made == 0


def test_translation_from_shards_is_the_run_from_files_and_resumes_mid_epoch(
    tmp_path: Path,
) -> None:
    """Trained from token shards, the run is the one trained from the plain files, bit for bit
    (the same tokenizer, pairs, batches and weights); stopped mid-epoch and resumed from the
    shards, it ends there too."""
    run, data = translation_case(tmp_path)
    train_translation(run, tmp_path / "full", data, progress=False)
    preprocess(tmp_path, data)
    from_shards = dataclasses.replace(run, data=dataclasses.replace(run.data, shards="shards"))
    train_split(train_translation, from_shards, data, tmp_path, stop=3)
    assert_same_end(tmp_path, stop=3)


def test_language_model_from_shards_is_the_run_from_the_file(tmp_path: Path) -> None:
    run, data = lm_case(tmp_path)
    train_lm(run, tmp_path / "full", data, progress=False)
    preprocess(tmp_path, data)
    from_shards = dataclasses.replace(run, data=dataclasses.replace(run.data, shards="shards"))
    train_split(train_lm, from_shards, data, tmp_path, stop=5)
    assert_same_end(tmp_path, stop=5)


def test_recurrent_encoder_decoder(tmp_path: Path) -> None:
    """The GRU baseline with attention, with dropout, stopped mid-epoch."""
    run, data = translation_case(tmp_path, rnn="gru", steps=6)
    train_translation(run, tmp_path / "full", data, progress=False)
    train_split(train_translation, run, data, tmp_path, stop=4)
    assert_same_end(tmp_path, stop=4)


def test_vision_transformer_across_an_epoch(tmp_path: Path) -> None:
    """The ViT on the digits (4 batches an epoch, the last one short), stopped at step 5:
    one batch into the second epoch, whose order is a new permutation."""
    (tmp_path / "run.toml").write_text(VIT_TOML)
    run = load_run_config(tmp_path / "run.toml", PINNED)
    train_vision(run, tmp_path / "full", tmp_path, progress=False)
    at_stop = train_split(train_vision, run, tmp_path, tmp_path, stop=5)
    assert at_stop.data == {"epoch": 1, "index": 256}
    assert_same_end(tmp_path, stop=5)


class EagerScaler(torch.amp.GradScaler):
    """A GradScaler that doubles its scale after every finite step (instead of every 2,000),
    so that within a few steps the scale overflows fp16 gradients, updates are skipped and
    the scale backs off: its state then decides the run."""

    def __init__(self, device: str = "cuda", **kw: Any) -> None:
        super().__init__(device, **{**kw, "growth_interval": 1})


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """bf16 and fp16 autocast (on the CPU).  In fp16 the GradScaler's state is part of the
    run: a resume that started again from the default scale would skip other updates."""
    monkeypatch.setattr(torch.amp, "GradScaler", EagerScaler)
    run, data = lm_case(tmp_path, dtype)
    train_lm(run, tmp_path / "full", data, progress=False)
    at_stop = train_split(train_lm, run, data, tmp_path, stop=5)
    if dtype == "float16":  # 2^16 at the start, 2^21 after 5 steps without an overflow
        assert at_stop.scaler["scale"] not in (2.0**16, 2.0**21), f"no overflow: {at_stop.scaler}"
    else:
        assert at_stop.scaler == {}
    assert_same_end(tmp_path, stop=5)
