"""Parallel text: pairs of line-aligned files, and the Multi30k corpus.

Multi30k (Elliott et al., 2016), task 1: English image captions with German and French
translations -- 29,000 training pairs, 1,014 validation, 1,000 in ``test_2016_flickr``.  The
files are read from the data folder (``$AIAYN_DATA/multi30k``); when absent they are
downloaded once from the dataset's public repository into that folder, each verified against
its SHA-256 checksum below (aiayn/data/download.py: a mismatch deletes the download and
raises; a broken download resumes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.data.download import Remote, fetch
from aiayn.data.files import read_lines
from aiayn.errors import UserError

SPLITS = ("train", "val", "test_2016_flickr")
LANGUAGES = ("en", "de", "fr")
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}"
MULTI30K_SHA256 = {  # as published in data/task1/raw/ of github.com/multi30k/dataset
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


@dataclass(frozen=True)
class Pair:
    source: str
    target: str
    line: int = field(default=0, compare=False)  # its line in the files (1-based; 0: unknown)


def read_parallel(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> list[Pair]:
    """Line-aligned sentence pairs.  Raises ValueError naming the files when their line counts
    differ, when a file is empty or not UTF-8, or when a line is empty on one side only."""
    src, tgt = read_lines(source), read_lines(target)
    if len(src) != len(tgt):
        raise UserError(
            f"parallel files differ in length: {source} has {len(src)} lines, {target} has {len(tgt)}"
        )
    for number, (s, t) in enumerate(zip(src, tgt, strict=True), 1):
        if bool(s.strip()) != bool(t.strip()):
            side = source if not s.strip() else target
            raise UserError(f"line {number} is empty in {side} but not in its pair")
    return [
        Pair(s, t, number)
        for number, (s, t) in enumerate(zip(src, tgt, strict=True), 1)
        if s.strip()
    ]


def multi30k_file(root: Path, split: str, lang: str, *, allow_download: bool = True) -> Path:
    """Path of one Multi30k file under ``root`` (downloaded and verified if missing)."""
    if split not in SPLITS:
        raise UserError(f"unknown Multi30k split {split!r}; expected one of {SPLITS}")
    if lang not in LANGUAGES:
        raise UserError(f"unknown Multi30k language {lang!r}; expected one of {LANGUAGES}")
    name = f"{split}.{lang}.gz"
    path = root / name
    if path.is_file():
        return path
    if not allow_download:
        raise UserError(f"Multi30k file {path} is missing (downloads disabled)")
    if name not in MULTI30K_SHA256:
        raise UserError(f"Multi30k file {path} is missing and no checksum is known for it")
    return fetch(Remote(MULTI30K_URL.format(name=name), MULTI30K_SHA256[name]), root)


def multi30k(
    root: Path, split: str, src_lang: str, tgt_lang: str, *, allow_download: bool = True
) -> list[Pair]:
    """Sentence pairs of one Multi30k split in the direction ``src_lang`` -> ``tgt_lang``."""
    if src_lang == tgt_lang:
        raise UserError(f"source and target language are both {src_lang!r}")
    return read_parallel(
        multi30k_file(root, split, src_lang, allow_download=allow_download),
        multi30k_file(root, split, tgt_lang, allow_download=allow_download),
    )
