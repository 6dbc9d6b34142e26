"""Translation: parallel data errors, token batching, training + resume, averaging, CLI."""

from __future__ import annotations

import gzip
import http.server
import threading
from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.cli import main
from aiayn.data.batching import padding_fraction, token_batches
from aiayn.data.parallel import download, read_parallel, sha256
from aiayn.train.average import average_checkpoints
from aiayn.train.config import load_run_config
from aiayn.train.translate import train_translation

DE = [
    "ein hund läuft",
    "eine katze schläft",
    "zwei männer",
    "ein kind spielt im park",
    "der ball ist rot",
]
EN = ["a dog runs", "a cat sleeps", "two men", "a child plays in the park", "the ball is red"]


def write_corpus(root: Path) -> None:
    m = root / "multi30k"
    m.mkdir(parents=True)
    for split, n in (("train", 12), ("val", 1), ("test_2016_flickr", 1)):
        for lang, lines in (("de", DE), ("en", EN)):
            with gzip.open(m / f"{split}.{lang}.gz", "wt", encoding="utf-8") as fh:
                fh.write("\n".join(lines * n) + "\n")


TOML = """
[model]
preset = "paper-base"
n_layers = 1
d_model = 32
n_heads = 4
d_ff = 64
max_len = 64
dropout = 0.1

[data]
bpe_vocab_size = 300

[train]
schedule = "paper"
lr = 0.1
warmup_steps = 4
beta2 = 0.98
adam_eps = 1e-9
weight_decay = 0.0
label_smoothing = 0.1
max_tokens = 64
max_steps = 6
eval_interval = 3
checkpoint_interval = 3
keep_snapshots = 2
"""


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path]:
    write_corpus(tmp_path / "data")
    (tmp_path / "run.toml").write_text(TOML)
    return tmp_path / "data", tmp_path / "run.toml"


def test_train_resume_average_translate(
    corpus: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, cfg = corpus
    run = load_run_config(cfg)
    full = train_translation(run, tmp_path / "full", data, progress=False)
    train_translation(run, tmp_path / "split", data, stop_after=3, progress=False)
    resumed = train_translation(run, tmp_path / "split", data, resume=True, progress=False)
    losses = [h["loss"] for h in full.history]
    assert [h["loss"] for h in resumed.history] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    assert losses[-1] < losses[0]
    snaps = sorted((tmp_path / "full" / "snapshots").iterdir())
    assert [s.name for s in snaps] == ["step_000000005", "step_000000006"]  # the end of the run
    assert (snaps[-1] / "tokenizer.json").is_file()  # snapshots translate on their own
    avg = average_checkpoints(snaps)
    a, b = aiayn.load(snaps[0]), aiayn.load(snaps[1])
    name = "encoder.blocks.0.ffn.w1.weight"
    torch.testing.assert_close(
        dict(avg.named_parameters())[name],
        (dict(a.named_parameters())[name] + dict(b.named_parameters())[name]) / 2,
    )
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


def test_parallel_file_errors(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x\ny\n")
    (tmp_path / "b").write_text("x\n")
    with pytest.raises(ValueError, match="differ in length.*2 lines.*1"):
        read_parallel(tmp_path / "a", tmp_path / "b")
    (tmp_path / "c").write_text("")
    with pytest.raises(ValueError, match="empty"):
        read_parallel(tmp_path / "c", tmp_path / "c")
    (tmp_path / "d").write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(ValueError, match="line 2: not valid UTF-8"):
        read_parallel(tmp_path / "d", tmp_path / "a")
    (tmp_path / "e").write_text("x\n\n")
    with pytest.raises(ValueError, match="line 2 is empty"):
        read_parallel(tmp_path / "e", tmp_path / "a")


def test_token_batches_respect_the_budget() -> None:
    g = torch.Generator().manual_seed(0)
    lengths = [(int(a), int(b)) for a, b in torch.randint(1, 40, (500, 2), generator=g)]
    batches = token_batches(lengths, 256, seed=3, epoch=1)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        assert len(b) * max(max(lengths[i]) for i in b) <= 256
    assert batches == token_batches(lengths, 256, seed=3, epoch=1)
    assert batches != token_batches(lengths, 256, seed=3, epoch=2)
    assert padding_fraction(lengths, batches) < padding_fraction(
        lengths, [list(range(i, i + 8)) for i in range(0, 496, 8)]
    )
    with pytest.raises(ValueError, match="example 0 has 300"):
        token_batches([(300, 2)], 256)


def test_download_verifies_the_checksum(tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    (served / "file.gz").write_bytes(b"hello multi30k")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(served), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/file.gz"
        good = sha256(served / "file.gz")
        assert download(url, tmp_path / "cache" / "file.gz", good).read_bytes() == b"hello multi30k"
        with pytest.raises(ValueError, match="checksum mismatch"):
            download(url, tmp_path / "cache" / "bad.gz", "0" * 64)
        assert not (tmp_path / "cache" / "bad.gz").exists()
        assert [p.name for p in (tmp_path / "cache").iterdir()] == ["file.gz"]  # no temp left
    finally:
        server.shutdown()


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
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = [
        sys.executable,
        "-m",
        "aiayn",
        "train",
        str(cfg),
        "--out",
        str(tmp_path / "one"),
        *common,
        "train.grad_accum=2",
    ]
    two = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29617",
        "-m", "aiayn", "train", str(cfg), "--out", str(tmp_path / "two"), *common, "train.grad_accum=1",
    ]  # fmt: skip
    for cmd in (one, two):
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)

    def losses(run: str) -> list[float]:
        rows = (tmp_path / run / "log.csv").read_text().splitlines()[1:]
        return [float(r.split(",")[1]) for r in rows]

    assert losses("two") == pytest.approx(losses("one"), rel=1e-4)
    state = json.loads((tmp_path / "two" / "checkpoint" / "run.json").read_text())
    assert state["train"]["grad_accum"] == 1
    a, b = aiayn.load(tmp_path / "one" / "checkpoint"), aiayn.load(tmp_path / "two" / "checkpoint")
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-4, msg=name)
