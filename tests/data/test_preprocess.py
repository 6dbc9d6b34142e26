"""aiayn preprocess: Multi30k into token shards equals what training from the files encodes;
bad lines left out and named; a stopped run resumes; the shards folder is never half-written."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from aiayn.data import shards
from aiayn.data.preprocess import PairFiles, preprocess_parallel, preprocess_text, tokenizer_digest
from aiayn.data.tokenizer import BPETokenizer, CharTokenizer, load_tokenizer
from aiayn.training.config import load_run_config
from aiayn.training.translate import PlainFiles

ROOT = Path(__file__).resolve().parents[2]


def multi30k_pairs(data: Path, split: str) -> PairFiles:
    m = data / "multi30k"
    return PairFiles(m / f"{split}.de.gz", m / f"{split}.en.gz")


@pytest.mark.slow
def test_multi30k_shards_hold_what_training_from_the_files_encodes(
    data_root: Path, tmp_path: Path
) -> None:
    """The README's translation config on the real Multi30k: the BPE model trained from the
    streamed files equals the one trained from the lists, and every pair's ids are equal."""
    out = tmp_path / "shards"
    result = preprocess_parallel(
        [multi30k_pairs(data_root, "train")],
        [multi30k_pairs(data_root, "val")],
        out,
        vocab_size=8000,
        max_len=256,
        workers=2,
        log=lambda _: None,
    )
    run = load_run_config(ROOT / "configs/multi30k_de_en.toml", {})
    files = PlainFiles(run, data_root)
    tokenizer = files.tokenizer()
    header, mapped = shards.open_parallel(out)
    assert header["tokenizer_sha256"] == tokenizer_digest(tokenizer)
    assert tokenizer_digest(load_tokenizer(out / "tokenizer.json")) == header["tokenizer_sha256"]
    want_train, want_valid = files.splits(tokenizer, 256)
    for got, want in ((mapped["train"], want_train), (mapped["valid"], want_valid)):
        for side in ("source", "target"):
            g, w = getattr(got, side), getattr(want, side)
            assert np.array_equal(g.offsets, w.offsets) and np.array_equal(g.tokens, w.tokens)
    assert (
        header["splits"]["train"]["pairs"] == 29_000 and header["splits"]["valid"]["pairs"] == 1_014
    )
    assert header["dtype"] == "uint16" and header["bad_lines"]["counts"] == {}
    hist = header["splits"]["train"]["source"]["length_histogram"]
    assert sum(hist) == 29_000 and len(hist) - 1 == header["splits"]["train"]["source"]["longest"]
    assert header["sources"]["train"][0]["source"]["sha256"] == shards_sha(
        data_root / "multi30k/train.de.gz"
    )
    assert (out / "manifest.json").is_file() and result.parts_run == 2
    shards.verify(out)
    assert not (tmp_path / ".shards.work").exists()


def shards_sha(path: Path) -> str:
    from aiayn.atomic import sha256_file

    return sha256_file(path)


def write(path: Path, lines: list[bytes]) -> Path:
    data = b"".join(line + b"\n" for line in lines)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    elif path.suffix == ".xz":
        path.write_bytes(lzma.compress(data))
    else:
        path.write_bytes(data)
    return path


GOOD = [(b"ein hund l\xc3\xa4uft", b"a dog runs"), (b"zwei katzen", b"two cats")] * 20


def test_bad_lines_are_left_out_and_named_by_file_and_line(tmp_path: Path) -> None:
    bad = [
        (b"kaputt \xff\xfe", b"broken"),
        (b"", b"only english"),
        (b"", b""),
        (b"lang " * 60, b"long"),
        (b"ok", b""),
    ]
    src = [*GOOD[:3], *bad, *GOOD[3:]]
    train = PairFiles(
        write(tmp_path / "t.de.xz", [s for s, _ in src]),
        write(tmp_path / "t.en", [t for _, t in src]),
    )
    valid = PairFiles(
        write(tmp_path / "v.de.gz", [s for s, _ in GOOD[:4]]),
        write(tmp_path / "v.en.gz", [t for _, t in GOOD[:4]]),
    )
    result = preprocess_parallel(
        [train],
        [valid],
        tmp_path / "out",
        vocab_size=300,
        max_len=40,
        workers=1,
        chunk=4,
        log=lambda _: None,
    )
    bad = result.header["bad_lines"]
    assert bad["counts"] == {"not UTF-8": 1, "empty on one side": 2, "over max_len": 1}
    named = [(Path(b["file"]).name, b["line"], b["reason"].split(":")[0]) for b in bad["first"]]
    assert named[:3] == [
        ("t.de.xz", 4, "not UTF-8"),
        ("t.de.xz", 5, "empty on one side"),
        ("t.de.xz", 7, named[2][2]),
    ]
    assert "over max_len=40" in bad["first"][2]["reason"] and named[3] == (
        "t.en",
        8,
        "empty on one side",
    )
    split = result.header["splits"]["train"]
    assert split["pairs"] == len(GOOD) and split["blank_pairs"] == 1
    _, mapped = shards.open_parallel(tmp_path / "out")
    tok = load_tokenizer(tmp_path / "out/tokenizer.json")
    rows = mapped["train"].source.rows(np.arange(len(GOOD)))
    assert [tok.decode(r.tolist()) for r in rows] == [s.decode() for s, _ in GOOD]


def test_files_of_unequal_length_and_missing_files_are_named(tmp_path: Path) -> None:
    a = write(tmp_path / "a.de", [b"eins", b"zwei"])
    b = write(tmp_path / "a.en", [b"one"])
    with pytest.raises(ValueError, match=r"a.en has 1 lines, .*a.de has more"):
        preprocess_parallel(
            [PairFiles(a, b)],
            [PairFiles(a, a)],
            tmp_path / "o",
            vocab_size=300,
            max_len=None,
            workers=1,
            log=lambda _: None,
        )
    with pytest.raises(ValueError, match="nope.de does not exist"):
        preprocess_parallel(
            [PairFiles(tmp_path / "nope.de", b)],
            [PairFiles(a, a)],
            tmp_path / "o",
            vocab_size=300,
            max_len=None,
            workers=1,
            log=lambda _: None,
        )
    assert not (tmp_path / "o").exists()


# A child that preprocesses and is killed at the K-th time a step named NAME is reached:
# after a part file is written, or inside the atomic commit of the shards folder.
KILLER = """
import os, signal, sys
from pathlib import Path
from aiayn import atomic
from aiayn.data import encode_chunks, preprocess as pp
name, k = sys.argv[1], int(sys.argv[2])
seen = [0]
def hook(step):
    if step == name:
        seen[0] += 1
        if seen[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
atomic.set_fault_hook(hook)
original = encode_chunks._save_part
def save(*a, **kw):
    original(*a, **kw)
    atomic.fs_step("part-written")
encode_chunks._save_part = save
tmp = Path(sys.argv[3])
pp.preprocess_parallel([pp.PairFiles(tmp / "t.de", tmp / "t.en")], [pp.PairFiles(tmp / "v.de", tmp / "v.en")],
                       tmp / "out", vocab_size=300, max_len=64, workers=1, chunk=5, log=print)
"""


def write_good(folder: Path) -> None:
    """t.de / t.en (train) and v.de / v.en (validation) of :data:`GOOD`."""
    for name, lines in (("t", GOOD), ("v", GOOD[:4])):
        write(folder / f"{name}.de", [s for s, _ in lines])
        write(folder / f"{name}.en", [t for _, t in lines])


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shards of :func:`write_good`'s files, by a run with two workers, never killed."""
    tmp = tmp_path_factory.mktemp("clean")
    write_good(tmp)
    preprocess_parallel(
        [PairFiles(tmp / "t.de", tmp / "t.en")],
        [PairFiles(tmp / "v.de", tmp / "v.en")],
        tmp / "clean",
        vocab_size=300,
        max_len=64,
        workers=2,
        chunk=5,
        log=lambda _: None,
    )
    return tmp / "clean"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("step", "k"), [("part-written", 3), ("files-written", 1), ("files-synced", 1)]
)
def test_a_killed_run_resumes_and_leaves_no_half_written_folder(
    tmp_path: Path, clean: Path, step: str, k: int
) -> None:
    """Killed at a part or a commit step, then resumed, the output equals a run never killed
    (made with two workers: the parts do not depend on who encoded them)."""
    write_good(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.run(
        [sys.executable, "-c", KILLER, step, str(k), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr
    assert not (tmp_path / "out").exists()  # nothing, or everything: never a part
    work = tmp_path / ".out.work"
    done_before = len(list((work / "parts").glob("*.npz")))
    assert done_before == (k if step == "part-written" else 9)
    logs: list[str] = []
    result = preprocess_parallel(
        [PairFiles(tmp_path / "t.de", tmp_path / "t.en")],
        [PairFiles(tmp_path / "v.de", tmp_path / "v.en")],
        tmp_path / "out",
        vocab_size=300,
        max_len=64,
        workers=1,
        chunk=5,
        log=logs.append,
    )
    assert result.parts_run == 9 - done_before and any("resuming" in m for m in logs)
    out = tmp_path / "out"
    assert sorted(p.name for p in clean.iterdir()) == sorted(p.name for p in out.iterdir())
    for f in sorted(clean.iterdir()):  # the same bytes, but for where the sources were read
        got = (out / f.name).read_bytes().replace(str(tmp_path).encode(), b"SOURCES")
        if f.name != "manifest.json":  # (it holds header.json's checksum)
            assert f.read_bytes().replace(str(clean.parent).encode(), b"SOURCES") == got, f.name
    shards.verify(out)
    assert not work.exists() and [p.name for p in tmp_path.glob(".out*")] == []


def test_another_input_starts_the_work_again(tmp_path: Path) -> None:
    for name, lines in (("t", GOOD), ("v", GOOD[:4])):
        write(tmp_path / f"{name}.de", [s for s, _ in lines])
        write(tmp_path / f"{name}.en", [t for _, t in lines])
    work = tmp_path / ".out.work" / "parts"
    work.mkdir(parents=True)
    (tmp_path / ".out.work" / "spec.json").write_text(json.dumps({"kind": "other"}))
    (work / "train-000-000000.npz").write_bytes(b"stale")
    logs: list[str] = []
    preprocess_parallel(
        [PairFiles(tmp_path / "t.de", tmp_path / "t.en")],
        [PairFiles(tmp_path / "v.de", tmp_path / "v.en")],
        tmp_path / "out",
        vocab_size=300,
        max_len=64,
        workers=1,
        log=logs.append,
    )
    assert any("other settings or inputs" in m for m in logs)
    with pytest.raises(ValueError, match="exists: pass --overwrite"):
        preprocess_parallel(
            [PairFiles(tmp_path / "t.de", tmp_path / "t.en")],
            [PairFiles(tmp_path / "v.de", tmp_path / "v.en")],
            tmp_path / "out",
            vocab_size=300,
            max_len=64,
            workers=1,
            log=logs.append,
        )


@pytest.mark.slow
def test_language_model_text_in_chunks_encodes_as_the_whole_text(
    data_root: Path, tmp_path: Path
) -> None:
    """Tiny Shakespeare, cut into 64 KiB chunks (at blank lines too): the byte-level BPE and
    the characters encode it to the ids of the whole text, and train the same tokenizer."""
    path = data_root / "tinyshakespeare/input.txt"
    text = path.read_text()
    for kind, vocab in (("char", 0), ("bpe", 1000)):
        out = tmp_path / kind
        result = preprocess_text(
            path,
            out,
            tokenizer_kind=kind,
            vocab_size=vocab,
            workers=2,
            chunk_bytes=64 << 10,
            log=lambda _: None,
        )
        assert result.parts_run > 10
        want = (
            CharTokenizer.from_text(text) if kind == "char" else BPETokenizer.from_text(text, vocab)
        )
        header, mapped = shards.open_text(out)
        assert header["tokenizer_sha256"] == tokenizer_digest(want)
        assert np.array_equal(mapped.array, np.asarray(want.encode(text)))


def test_chunks_are_cut_only_where_a_newline_ends_a_pre_token(tmp_path: Path) -> None:
    """Cut wherever it may be (chunks of 1 byte), in a text of indented lines, tabs, blank
    lines, trailing spaces and Windows line ends: the ids are the whole text's, though GPT-2's
    pre-tokenizer joins white space across lines ("x \\n" + "b" is " ", "\\n", "b")."""
    block = "{w}\n   indented\n\n\tTab\n \nspace before \nwin\r\ndows\r\n\r\nend\n"
    text = "".join(block.format(w=w) for w in ["a", "b"] * 30)
    path = tmp_path / "t.txt"
    path.write_bytes(text.encode())
    want = BPETokenizer.from_text(text, 300)
    result = preprocess_text(
        path,
        tmp_path / "o",
        tokenizer_kind="bpe",
        vocab_size=300,
        workers=1,
        chunk_bytes=1,
        log=lambda _: None,
    )
    assert result.parts_run == 2 * 60  # cut before "dows" and before each next block only
    header, mapped = shards.open_text(tmp_path / "o")
    assert header["tokenizer_sha256"] == tokenizer_digest(want)
    assert np.array_equal(mapped.array, np.asarray(want.encode(text)))
