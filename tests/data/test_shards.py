"""Token shards from elsewhere are checked when they are opened: a header with a field of the
wrong kind, offsets that fall or overrun, an id past the vocabulary, a file cut short, a
manifest that names a file outside the folder -- each is a ValueError that names the file and
what is wrong, before training reads a token.  Each attack is on a copy of real shards (made
by ``aiayn preprocess``), its manifest removed, as someone handing over a folder would."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aiayn.atomic import MANIFEST_FILE, verify_manifest
from aiayn.data import shards
from aiayn.data.preprocess import PairFiles, preprocess_parallel, preprocess_text
from tests.conftest import LM_TEXT, LM_TOML, json_values

LINES = [
    ("ein hund läuft", "a dog runs"),
    ("zwei katzen schlafen", "two cats sleep"),
    ("ein mann liest ein buch", "a man reads a book"),
    ("der ball ist rot", "the ball is red"),
]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("shards")
    for name in ("t", "v"):
        (tmp / f"{name}.de").write_text("\n".join(s for s, _ in LINES * 3) + "\n")
        (tmp / f"{name}.en").write_text("\n".join(t for _, t in LINES * 3) + "\n")
    out = tmp / "shards"
    preprocess_parallel(
        [PairFiles(tmp / "t.de", tmp / "t.en")],
        [PairFiles(tmp / "v.de", tmp / "v.en")],
        out,
        vocab_size=300,
        max_len=64,
        workers=1,
        chunk=100,
        log=lambda _: None,
    )
    return out


@pytest.fixture
def copy(made: Path, tmp_path: Path) -> Path:
    """A copy of the real shards without their manifest (which would name most changes)."""
    folder = tmp_path / "copy"
    shutil.copytree(made, folder)
    (folder / MANIFEST_FILE).unlink()
    return folder


def edit_header(folder: Path, **fields: object) -> None:
    path = folder / shards.HEADER_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def edit_array(path: Path, dtype: type, change: Callable[[np.ndarray], None]) -> None:
    values = np.fromfile(path, dtype=dtype)
    change(values)
    values.tofile(path)


def test_real_shards_open(made: Path) -> None:
    header, splits = shards.open_parallel(made)
    assert len(splits["train"].source) == 12 and header["vocab_size"] > 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": 5}, "kind = 5; expected 'parallel' or 'text'"),
        ({"dtype": "object"}, "dtype = 'object'; expected 'uint16' or 'uint32'"),
        ({"vocab_size": "300"}, "vocab_size = '300'; expected a positive integer"),
        ({"vocab_size": 70000}, "does not hold a vocabulary of 70000"),
        ({"splits": ["train", "../x"]}, "splits = ['train', '../x']; expected an object whose"),
        ({"tokenizer_sha256": "abc"}, "tokenizer_sha256 = 'abc'; expected a SHA-256 of 64 hex"),
        (
            {"splits": {"train": {"source": {"longest": "9"}, "target": {"longest": 3}}}},
            "splits.train.source.longest = '9'; expected a non-negative integer",
        ),
    ],
)
def test_a_header_field_of_the_wrong_kind_is_named(
    copy: Path, fields: dict[str, object], message: str
) -> None:
    edit_header(copy, **fields)
    with pytest.raises(ValueError, match="header.json: ") as err:
        shards.open_parallel(copy)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "field", ["kind", "dtype", "vocab_size", "tokenizer_sha256", "splits", "splits.valid.target"]
)
def test_a_header_field_that_is_missing_is_named(copy: Path, field: str) -> None:
    """Before, a header without ``tokenizer_sha256`` or a side's ``longest`` opened, and
    training then stopped on a KeyError."""
    path = copy / shards.HEADER_FILE
    header = json.loads(path.read_text())
    *parents, last = field.split(".")
    holder = header
    for key in parents:
        holder = holder[key]
    del holder[last]
    path.write_text(json.dumps(header))
    named = "splits.valid.target.longest" if "." in field else field
    with pytest.raises(ValueError, match=f"header.json: {named} = missing; expected "):
        shards.open_parallel(copy)


def test_offsets_that_fall_are_named(copy: Path) -> None:
    def swap(offsets: np.ndarray) -> None:
        offsets[2], offsets[3] = offsets[3], offsets[2]

    edit_array(copy / shards.idx_name("train", "source"), np.int64, swap)
    with pytest.raises(ValueError, match=r"train.source.idx: offset 3 \(\d+\) is below offset 2"):
        shards.open_parallel(copy)


def test_offsets_that_overrun_the_tokens_are_named(copy: Path) -> None:
    def overrun(offsets: np.ndarray) -> None:
        offsets[-1] += 5

    edit_array(copy / shards.idx_name("valid", "target"), np.int64, overrun)
    with pytest.raises(ValueError, match=r"valid.target.idx: offsets run from 0 to \d+; expected"):
        shards.open_parallel(copy)


def test_a_token_file_cut_short_is_named(copy: Path) -> None:
    path = copy / shards.bin_name("train", "target")
    path.write_bytes(path.read_bytes()[:-4])  # two uint16 ids
    with pytest.raises(ValueError, match="train.target.idx: offsets run from 0 to"):
        shards.open_parallel(copy)


def test_a_token_file_cut_mid_id_is_named(copy: Path) -> None:
    path = copy / shards.bin_name("train", "source")
    path.write_bytes(path.read_bytes()[:-1])  # half a uint16 id
    with pytest.raises(
        ValueError, match=r"train.source.bin: size = \d+ bytes; expected a whole number of uint16"
    ):
        shards.open_parallel(copy)


def test_a_missing_token_file_is_named(copy: Path) -> None:
    (copy / shards.bin_name("valid", "source")).unlink()
    with pytest.raises(ValueError, match="valid.source.bin: missing .*; expected the shard file"):
        shards.open_parallel(copy)


def test_a_token_file_linked_out_of_the_folder_is_refused(copy: Path, tmp_path: Path) -> None:
    path = copy / shards.bin_name("train", "target")
    outside = tmp_path / "elsewhere.bin"
    path.rename(outside)
    path.symlink_to(outside)
    with pytest.raises(
        ValueError, match=r"header.json: 'train.target.bin' leads out of .*copy \(a symbolic"
    ):
        shards.open_parallel(copy)


def test_sides_of_different_lengths_are_named(copy: Path) -> None:
    """The target side one sentence short, its offsets and tokens consistent."""
    idx = copy / shards.idx_name("train", "target")
    offsets = np.fromfile(idx, dtype=np.int64)
    offsets[:-1].tofile(idx)
    path = copy / shards.bin_name("train", "target")
    path.write_bytes(path.read_bytes()[: int(offsets[-2]) * 2])
    with pytest.raises(
        ValueError, match=r"train.target.idx: sentences = 11; expected as many as the source side"
    ):
        shards.open_parallel(copy)


def test_a_damaged_folder_stops_training_at_open(copy: Path) -> None:
    """The open path a translation run takes (aiayn/training/translate.py) names the field."""
    from aiayn.training.translate import TokenShards

    edit_array(copy / shards.idx_name("train", "source"), np.int64, lambda o: o.__setitem__(1, -1))
    with pytest.raises(ValueError, match=r"train.source.idx: offset 1 \(-1\) is below offset 0"):
        TokenShards(copy)


def test_an_id_past_the_vocabulary_is_named(copy: Path) -> None:
    vocab = json.loads((copy / shards.HEADER_FILE).read_text())["vocab_size"]

    def poison(ids: np.ndarray) -> None:
        ids[7] = vocab

    edit_array(copy / shards.bin_name("train", "source"), np.uint16, poison)
    with pytest.raises(ValueError, match=f"train.source.bin: token 7 has id {vocab}; expected"):
        shards.open_parallel(copy)


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/hostname", "link.bin"])
def test_a_manifest_names_only_files_inside_the_folder(
    made: Path, tmp_path: Path, name: str
) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(made, folder)
    (tmp_path / "outside.bin").write_bytes(b"12")
    (folder / "link.bin").symlink_to(tmp_path / "outside.bin")
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    manifest["files"][name] = {"size": 2, "sha256": "0" * 64}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    for read in (shards.open_parallel, verify_manifest):
        with pytest.raises(
            ValueError, match="manifest.json: .* (is not a file inside|leads out of)"
        ):
            read(folder)


@pytest.fixture(scope="module")
def text_made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A language model's shards (one stream of character ids) of :data:`LM_TEXT`."""
    tmp = tmp_path_factory.mktemp("text")
    (tmp / "corpus.txt").write_text(LM_TEXT)
    preprocess_text(
        tmp / "corpus.txt",
        tmp / "shards",
        tokenizer_kind="char",
        vocab_size=0,
        workers=1,
        log=lambda _: None,
    )
    return tmp / "shards"


@pytest.fixture
def text_copy(text_made: Path, tmp_path: Path) -> Path:
    """A copy of the text shards and the run that trains on them, without the manifest."""
    shutil.copytree(text_made, tmp_path / "shards")
    (tmp_path / "shards" / MANIFEST_FILE).unlink()
    (tmp_path / "corpus.txt").write_text(LM_TEXT)
    (tmp_path / "run.toml").write_text(LM_TOML.replace('text = "corpus.txt"', 'shards = "shards"'))
    return tmp_path / "shards"


def train_lm(root: Path) -> int:
    """``aiayn train`` of the run :func:`text_copy` wrote, as a user would start it."""
    from aiayn.cli import main

    argv = ["train", str(root / "run.toml"), "--out", str(root / "run"), "--data", str(root)]
    return main([*argv, "--set", "train.max_steps=1"])


def test_real_text_shards_open(text_made: Path) -> None:
    header, stream = shards.open_text(text_made)
    assert header["kind"] == "text" and len(stream.array) == header["tokens"]


def test_an_id_past_the_vocabulary_stops_a_language_model_at_open(
    text_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab = json.loads((text_copy / shards.HEADER_FILE).read_text())["vocab_size"]
    edit_array(text_copy / shards.TEXT_FILE, np.uint16, lambda ids: ids.__setitem__(5, vocab))
    assert train_lm(text_copy.parent) == 2
    err = capsys.readouterr().err
    assert f"text.bin: token 5 has id {vocab}; expected ids below" in err, err
    assert not (text_copy.parent / "run").exists()


def test_text_shards_without_their_tokenizer_digest_stop_at_open(
    text_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, this was a KeyError from inside the training loop's set-up."""
    header = json.loads((text_copy / shards.HEADER_FILE).read_text())
    del header["tokenizer_sha256"]
    (text_copy / shards.HEADER_FILE).write_text(json.dumps(header))
    assert train_lm(text_copy.parent) == 2
    err = capsys.readouterr().err
    assert "header.json: tokenizer_sha256 = missing; expected a SHA-256" in err, err


HEADER_KEYS = ("format", "version", "kind", "dtype", "vocab_size", "splits", "counts")
JSON = json_values(max_leaves=8)


@given(
    fields=st.dictionaries(st.sampled_from(HEADER_KEYS) | st.text(max_size=6), JSON, max_size=6),
    valid_start=st.booleans(),
)
@settings(suppress_health_check=list(HealthCheck))
def test_any_header_is_read_or_named(
    made: Path, fields: dict[str, object], valid_start: bool
) -> None:
    """Whatever ``header.json`` holds -- the real one with fields replaced, or any object --
    opening the folder gives its splits or a ValueError naming ``header.json`` (or the file the
    header's values made it read)."""
    base = json.loads((made / shards.HEADER_FILE).read_text()) if valid_start else {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "s"
        shutil.copytree(made, folder)
        (folder / MANIFEST_FILE).unlink()
        (folder / shards.HEADER_FILE).write_text(json.dumps({**base, **fields}))
        try:
            shards.open_parallel(folder)
        except ValueError as err:
            assert str(folder) in str(err), err
