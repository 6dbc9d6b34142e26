"""Translation: parallel data errors, token batching, training + resume, averaging, CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.cli import main
from aiayn.training.average import average_checkpoints
from aiayn.training.config import load_run_config
from aiayn.training.translate import train_translation
from tests.conftest import TRANSLATION_TOML, free_port, write_corpus


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path]:
    write_corpus(tmp_path / "data")
    (tmp_path / "run.toml").write_text(TRANSLATION_TOML)
    return tmp_path / "data", tmp_path / "run.toml"


def test_an_over_long_training_sentence_is_named(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    data, cfg = corpus
    run = load_run_config(cfg, {"model.max_len": 4})
    with pytest.raises(
        ValueError,
        match=r"the training pair at line 1 has a"
        r" (source|target) sentence of \d+ tokens, more than the model's max_len=4",
    ):
        train_translation(run, tmp_path / "run", data, progress=False)
    # Own files: the error names the line in the files, empty lines counted.
    (data / "own.de").write_text("\n\nein hund\n\n" + "ein hund läuft " * 40 + "\n")
    (data / "own.en").write_text("\n\na dog\n\na dog\n")
    own = {"data.train_source": "own.de", "data.train_target": "own.en"}
    with pytest.raises(ValueError, match=r"the training pair at line 5 has a source sentence"):
        train_translation(load_run_config(cfg, own), tmp_path / "run2", data, progress=False)


def test_train_resume_average_translate(
    corpus: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, cfg = corpus
    run = load_run_config(cfg)
    full = train_translation(run, tmp_path / "full", data, progress=False)
    train_translation(run, tmp_path / "split", data, stop_after=3, progress=False)
    resumed = train_translation(run, tmp_path / "split", data, resume=True, progress=False)
    losses = [h["loss"] for h in full.history]
    # two runs, each measuring its linear kernel (MKL or oneDNN): fp32 sums in other orders
    assert [h["loss"] for h in resumed.history] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    assert losses[-1] < losses[0]
    snaps = sorted((tmp_path / "full" / "snapshots").iterdir())
    assert [s.name for s in snaps] == ["step_000000005", "step_000000006"]  # the end of the run
    assert (snaps[-1] / "tokenizer.json").is_file()  # snapshots translate on their own
    avg = average_checkpoints(snaps)
    a, b = aiayn.load_model(snaps[0]), aiayn.load_model(snaps[1])
    name = "encoder.blocks.0.ffn.w1.weight"
    torch.testing.assert_close(
        dict(avg.named_parameters())[name],
        (dict(a.named_parameters())[name] + dict(b.named_parameters())[name]) / 2,
    )
    # `aiayn average --out` replaces what is there: never a run, a link, or (without
    # --overwrite) a folder that holds anything.
    snap_args = ["average", *map(str, snaps), "--out"]
    before = sorted(p.name for p in (tmp_path / "full").iterdir())
    assert main([*snap_args, str(tmp_path / "full")]) == 2  # a run folder
    assert main([*snap_args, str(tmp_path / "full" / "checkpoint")]) == 2  # its checkpoint
    assert sorted(p.name for p in (tmp_path / "full").iterdir()) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("important")
    assert main([*snap_args, str(mine)]) == 2
    assert (mine / "thesis.tex").read_text() == "important"
    assert main([*snap_args, str(mine), "--overwrite"]) == 0
    assert (mine / "model.safetensors").is_file() and not (mine / "thesis.tex").exists()
    assert main([*snap_args, str(tmp_path / "new")]) == 0
    other = tmp_path / "other_tok"  # the same model under another vocabulary
    shutil.copytree(snaps[0], other)
    (other / "tokenizer.json").write_text(
        (other / "tokenizer.json").read_text().replace('"a"', '"A"', 1)
    )
    assert main(["average", str(snaps[1]), str(other), "--out", str(tmp_path / "x")]) == 2
    assert "their tokenizers (tokenizer.json) differ" in capsys.readouterr().err
    ckpt = str(tmp_path / "full" / "checkpoint")
    src = tmp_path / "in.txt"
    src.write_text("ein hund läuft\n\neine katze schläft\n")
    assert (
        main(
            [
                "translate",
                "--checkpoint",
                ckpt,
                "--input",
                str(src),
                "--output",
                str(tmp_path / "out.txt"),
            ]
        )
        == 0
    )
    out = (tmp_path / "out.txt").read_text().split("\n")
    assert len(out) == 4 and out[1] == ""  # an empty line translates to an empty line
    assert main(["evaluate", "--checkpoint", ckpt, "--data", str(data), "--greedy"]) == 0
    assert "BLEU" in capsys.readouterr().out
    src.write_text("hund " * 200 + "\n")
    assert main(["translate", "--checkpoint", ckpt, "--input", str(src)]) == 2
    assert "line 1 has" in capsys.readouterr().err
    src.write_bytes(b"ein hund\n\xff\xfe\n")  # the file and line named, not a bare codec error
    assert main(["translate", "--checkpoint", ckpt, "--input", str(src)]) == 2
    assert f"{src}, line 2: not valid UTF-8" in capsys.readouterr().err
    limit0 = ["evaluate", "--checkpoint", ckpt, "--data", str(data), "--limit", "0"]
    assert main(limit0) == 2  # it scored every sentence
    assert "--limit 0: score at least 1 sentence" in capsys.readouterr().err


@pytest.mark.slow
def test_two_torchrun_processes_match_one_process(
    corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    import json
    import os
    import subprocess
    import sys

    data, cfg = corpus
    common = [
        "--data",
        str(data),
        "--set",
        "model.dropout=0.0",
        "train.max_steps=4",
        "train.keep_snapshots=0",
    ]
    # one process: this one (as `aiayn train`); two: torchrun's, each on one thread
    one = ["train", str(cfg), "--out", str(tmp_path / "one"), *common, "train.threads=1"]
    assert main([*one, "train.grad_accum=2"]) == 0
    two = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "aiayn",
        "train",
        str(cfg),
        "--out",
        str(tmp_path / "two"),
        *common,
        "train.grad_accum=1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(two, check=True, env=env, capture_output=True, timeout=300)

    def losses(run: str) -> list[float]:
        rows = (tmp_path / run / "log.csv").read_text().splitlines()[1:]
        return [float(r.split(",")[1]) for r in rows]

    # DDP all-reduces the gradients: a sum in another order, its rounding grown through the steps
    assert losses("two") == pytest.approx(losses("one"), rel=1e-4)
    state = json.loads((tmp_path / "two" / "checkpoint" / "run.json").read_text())
    assert state["train"]["grad_accum"] == 1
    a, b = (
        aiayn.load_model(tmp_path / "one" / "checkpoint"),
        aiayn.load_model(tmp_path / "two" / "checkpoint"),
    )
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=name)  # (as above)


def test_token_count_batches_pick_the_linear_kernel_at_their_token_budget(
    corpus: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token-count batches change shape every step; their rows are padded to bounded shapes
    (aiayn/nn/cpu_kernels.py), so the run times oneDNN against MKL at its token budget and keeps the
    faster.  The oneDNN run trains the same model as an MKL run, to fp32 rounding."""
    import aiayn.nn.cpu_kernels as cpu_kernels
    from aiayn.checkpoint import RunDir

    data, cfg = corpus
    probed: list[int] = []

    def onednn_faster(rows: int, *args: int, **kw: int) -> float:
        probed.append(rows)
        return 2.0

    monkeypatch.setattr(cpu_kernels, "onednn_speedup", onednn_faster)
    used: list[bool] = []
    real_use = cpu_kernels.for_training
    monkeypatch.setattr(
        cpu_kernels, "for_training", lambda m, k: used.append(k == "onednn") or real_use(m, k)
    )
    onednn = train_translation(load_run_config(cfg), tmp_path / "onednn", data, progress=False)
    assert probed == [64] and used == [True]  # max_tokens = 64
    assert RunDir(tmp_path / "onednn").load()[1].kernels == {"linear": "onednn"}

    cfg.write_text(TRANSLATION_TOML + 'linear_kernel = "mkl"\n')
    mkl = train_translation(load_run_config(cfg), tmp_path / "mkl", data, progress=False)
    assert probed == [64] and used == [True, False]  # a kernel set in the config is not probed
    # oneDNN and MKL sum in other orders: fp32 rounding, grown through the steps
    assert [h["loss"] for h in onednn.history] == pytest.approx(
        [h["loss"] for h in mkl.history], rel=1e-4
    )


def shards_of(cfg: Path, data: Path, *extra: str) -> None:
    assert (
        main(
            [
                "preprocess",
                str(cfg),
                "--data",
                str(data),
                "--out",
                str(data / "shards"),
                "--workers",
                "1",
                *extra,
            ]
        )
        == 0
    )


def test_each_rank_reads_only_the_tokens_of_its_own_batches(corpus: tuple[Path, Path]) -> None:
    """Every rank plans all of a step's batches (from lengths alone) and reads the pairs of its
    own: rank 1 of 2 reads exactly the pairs of the step's second half."""
    import numpy as np

    from aiayn.data.shards import Sequences
    from aiayn.training.translate import TokenShards, TranslationTask

    data, cfg = corpus
    shards_of(cfg, data)
    source = TokenShards(data / "shards")
    train, valid = source.splits(source.tokenizer(), 64)
    task = TranslationTask(train, valid, max_tokens=64, label_smoothing=0.1, seed=1)
    plan = [task.batches[k] for k in range(4)]
    read: list[int] = []
    rows = Sequences.rows

    def recording(self: Sequences, indices: np.ndarray) -> list[np.ndarray]:
        if self is train.source:
            read.extend(indices.tolist())
        return rows(self, indices)

    Sequences.rows = recording  # type: ignore[method-assign]
    try:
        batches = task.next_batches(2, rank=1, world=2)
    finally:
        Sequences.rows = rows  # type: ignore[method-assign]
    assert read == [i for b in plan[2:4] for i in b.tolist()]
    assert [b[0].shape[0] for b in batches] == [len(plan[2]), len(plan[3])]


def test_shards_that_do_not_fit_the_run_are_named(
    corpus: tuple[Path, Path], tmp_path: Path
) -> None:
    data, cfg = corpus
    with pytest.raises(ValueError, match="holds no token shards.*aiayn preprocess"):
        train_translation(
            load_run_config(cfg, {"data.shards": "nowhere"}), tmp_path / "r0", data, progress=False
        )
    shards_of(cfg, data)
    short = load_run_config(cfg, {"data.shards": "shards", "model.max_len": 6})
    with pytest.raises(ValueError, match=r"hold a pair of \d+ tokens .*max_len=6.*--max-len 6"):
        train_translation(short, tmp_path / "r1", data, progress=False)
    # a run started from the files (its own BPE), resumed from shards of another vocabulary
    other = load_run_config(cfg, {"data.bpe_vocab_size": 280, "train.max_steps": 2})
    train_translation(other, tmp_path / "r2", data, progress=False)
    resumed = load_run_config(cfg, {"data.shards": "shards"})
    with pytest.raises(ValueError, match="made with another tokenizer than this run's"):
        train_translation(resumed, tmp_path / "r2", data, resume=True, progress=False)


def test_batches_read_from_token_sequences_are_the_collated_examples(
    corpus: tuple[Path, Path],
) -> None:
    """The reader's batches against the list-based oracle: source + EOS, BOS + target, target +
    EOS, right-padded, for every batch of an epoch."""
    import numpy as np

    from aiayn.training.translate import (
        PlainFiles,
        collate,
        collate_split,
        encode_pairs,
        load_pairs,
    )

    data, cfg = corpus
    run = load_run_config(cfg)
    files = PlainFiles(run, data)
    tokenizer = files.tokenizer()
    train, _ = files.splits(tokenizer, 64)
    examples = encode_pairs(load_pairs(run, data, "train"), tokenizer)
    for start in range(0, len(examples), 7):
        idx = np.arange(start, min(start + 7, len(examples)))
        got, want = collate_split(train, idx), collate([examples[i] for i in idx])
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
