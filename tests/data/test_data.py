"""Data: parallel files with clear errors, token-count batches within budget, a checksummed
download, tokenizers and token streams."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from aiayn.data.batching import padding_fraction, token_batches
from aiayn.data.files import split_lines
from aiayn.data.lm_data import TokenStream
from aiayn.data.parallel import read_parallel
from aiayn.data.tokenizer import CharTokenizer, load_tokenizer


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


def test_lines_split_at_newlines_only(tmp_path: Path) -> None:
    # U+2028, NEL and form feeds inside a sentence must not split it: str.splitlines did, and
    # paired half a sentence with the next one's translation.
    (tmp_path / "a.de").write_text(
        "Ein\u2028Hund.\nZwei Katzen.\r\nDrei\x0cVögel.\n", encoding="utf-8"
    )
    (tmp_path / "a.en").write_text("A dog.\nTwo cats.\nThree\x85birds.", encoding="utf-8")
    pairs = [(p.source, p.target) for p in read_parallel(tmp_path / "a.de", tmp_path / "a.en")]
    assert pairs == [
        ("Ein\u2028Hund.", "A dog."),
        ("Zwei Katzen.", "Two cats."),
        ("Drei\x0cVögel.", "Three\x85birds."),
    ]
    assert split_lines("a\n\nb\n") == ["a", "", "b"] and split_lines("a") == ["a"]


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


def test_char_tokenizer_and_stream(tmp_path: Path) -> None:
    tok = CharTokenizer.from_text("hello world")
    assert tok.vocab_size == 8 and tok.decode(tok.encode("hello")) == "hello"
    with pytest.raises(ValueError, match="'z'"):
        tok.encode("z")
    tok.save(tmp_path / "t.json")
    assert load_tokenizer(tmp_path / "t.json").encode("low") == tok.encode("low")
    stream = TokenStream(torch.arange(100), train_fraction=0.9)
    x, y = stream.batch("train", 3, 8)
    assert x.shape == (3, 8) and torch.equal(y, x + 1) and int(x.max()) < 90
    vx, _ = stream.batch("val", 2, 4)
    assert int(vx.min()) >= 90
    assert math.isclose(len(stream.splits["val"]), 10)
