"""Downloading corpora: checksummed, cached, resumable -- and the WMT14 English-German recipe.

``fetch`` brings one file into a cache folder: it resumes a partial download where it
stopped (an HTTP ``Range`` request), checks the size and SHA-256 before the file takes its
name, and finds a verified file in the cache the next time without touching the network.

``prepare_wmt14_en_de`` is the paper's data (§5.1: "the standard WMT 2014 English-German
dataset consisting of about 4.5 million sentence pairs"): Europarl v7, Common Crawl and News
Commentary v9 from statmt.org (the SHA-256 and sizes are those TensorFlow Datasets publishes
for the same URLs), joined into ``train.en`` / ``train.de``; newstest2013 for validation and
newstest2014 for the test, as sacreBLEU distributes them (its own download and checks), so
that the BLEU of ``aiayn evaluate`` and its signature are sacreBLEU's.  Every step writes its
output atomically and is skipped when done: a stopped preparation resumes.

Tests and CI never download: they run ``fetch`` against a local HTTP server.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiayn.atomic import fsync_path, sha256_file
from aiayn.errors import UserError

Log = Callable[[str], None]
BLOCK = 1 << 20


@dataclass(frozen=True)
class Remote:
    """A file to download: where, and what it must be."""

    url: str
    sha256: str
    size: int | None = None

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]


def default_cache() -> Path:
    """``$AIAYN_CACHE``, else ``$XDG_CACHE_HOME/aiayn``, else ``~/.cache/aiayn``."""
    if os.environ.get("AIAYN_CACHE"):
        return Path(os.environ["AIAYN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "aiayn"


def _verified_marker(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified")


def _is_verified(path: Path, remote: Remote) -> bool:
    """A cached file checked before (its marker records the checksum, size and mtime)."""
    marker = _verified_marker(path)
    if not (path.is_file() and marker.is_file()):
        return False
    st = path.stat()
    return marker.read_text().split() == [remote.sha256, str(st.st_size), str(st.st_mtime_ns)]


def _mark_verified(path: Path, remote: Remote) -> None:
    st = path.stat()
    _verified_marker(path).write_text(f"{remote.sha256} {st.st_size} {st.st_mtime_ns}\n")


def _copy_response(remote: Remote, partial: Path, timeout: float, log: Log) -> None:
    """Append the rest of ``remote`` to ``partial`` (from its current size, by a Range
    request; from the start if the server ignores the range), never more than one byte past
    its declared size."""
    start = partial.stat().st_size if partial.exists() else 0
    request = urllib.request.Request(
        remote.url, headers={"Range": f"bytes={start}-"} if start else {}
    )
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416:  # nothing past ``start``: the size and checksum checks decide
            return
        raise
    with response:
        resumed = start > 0 and response.status == 206
        if start and not resumed:
            log(f"{remote.url}: the server does not resume; downloading from the start")
        done = start if resumed else 0
        length = response.headers.get("Content-Length")
        sent = done + int(length) if length else None  # where the server's answer ends
        total = remote.size or sent or 0
        step = max(total // 20, 1)
        shown = done // step
        # A byte past the declared size is enough to know the file is wrong: read no further.
        limit = remote.size + 1 if remote.size is not None else None
        with open(partial, "ab" if resumed else "wb") as out:
            while block := response.read(BLOCK if limit is None else min(BLOCK, limit - done)):
                out.write(block)
                done += len(block)
                if total and done // step > shown:
                    shown = done // step
                    log(f"{remote.name}: {done / 1e6:,.0f} of {total / 1e6:,.0f} MB")
            out.flush()
            os.fsync(out.fileno())
    over = limit is not None and done >= limit  # more than declared: the size check says so
    if sent is not None and done < sent and not over:  # closed early, without an error
        raise ConnectionError(f"the connection closed after {done:,} of {sent:,} bytes")


def fetch(
    remote: Remote,
    cache: str | os.PathLike[str] | None = None,
    *,
    timeout: float = 60.0,
    attempts: int = 3,
    log: Log = print,
) -> Path:
    """``remote`` in the cache folder, downloaded if it is not there yet (resuming a partial
    download, up to ``attempts`` connections), its size and SHA-256 checked before it takes
    its name.  A mismatch deletes the download and raises ValueError naming the URL."""
    folder = Path(cache) if cache is not None else default_cache()
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / remote.name
    if _is_verified(dest, remote):
        return dest
    if dest.is_file() and sha256_file(dest) == remote.sha256:
        _mark_verified(dest, remote)
        return dest
    partial = folder / f"{remote.name}.part"
    for attempt in range(1, attempts + 1):
        try:
            _copy_response(remote, partial, timeout, log)
            break
        except (OSError, urllib.error.URLError) as err:
            if attempt == attempts:
                raise UserError(
                    f"cannot download {remote.url}: {err} (what arrived is kept in {partial};"
                    " run again to resume)"
                ) from err
            log(f"{remote.url}: {err}; resuming (attempt {attempt + 1} of {attempts})")
    size = partial.stat().st_size
    if remote.size is not None and size != remote.size:
        partial.unlink()
        raise UserError(f"{remote.url}: {size} bytes arrived, expected {remote.size}")
    got = sha256_file(partial)
    if got != remote.sha256:
        partial.unlink()
        raise UserError(f"checksum mismatch for {remote.url}: expected {remote.sha256}, got {got}")
    os.replace(partial, dest)
    _mark_verified(dest, remote)
    return dest


# --- WMT14 English-German -------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """One training corpus inside an archive: its English and German members."""

    archive: Remote
    english: str
    german: str


STATMT = "http://www.statmt.org"
WMT14_EN_DE = (
    Corpus(
        Remote(
            f"{STATMT}/wmt13/training-parallel-europarl-v7.tgz",
            "0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7",
            657632379,
        ),
        "training/europarl-v7.de-en.en",
        "training/europarl-v7.de-en.de",
    ),
    Corpus(
        Remote(
            f"{STATMT}/wmt13/training-parallel-commoncrawl.tgz",
            "c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5",
            918311367,
        ),
        "commoncrawl.de-en.en",
        "commoncrawl.de-en.de",
    ),
    Corpus(
        Remote(
            f"{STATMT}/wmt14/training-parallel-nc-v9.tgz",
            "cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485",
            80418416,
        ),
        "training/news-commentary-v9.de-en.en",
        "training/news-commentary-v9.de-en.de",
    ),
)
# (sacreBLEU test set, its language pair) -> our split name
WMT14_EVAL = {"valid": ("wmt13", "en-de"), "test": ("wmt14", "en-de")}


def _extract_members(archive: Path, members: Sequence[str], dest: Sequence[Path]) -> None:
    """The named members of a .tgz, each written atomically to its destination."""
    wanted = dict(zip(members, dest, strict=True))
    found: set[str] = set()
    with tarfile.open(archive, "r:gz") as tar:
        for info in tar:
            if info.name in wanted and info.isfile():
                src = tar.extractfile(info)
                assert src is not None
                tmp = wanted[info.name].with_name(f".{wanted[info.name].name}.part")
                with src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, BLOCK)
                _replace_durably(tmp, wanted[info.name])
                found.add(info.name)
    missing = set(members) - found
    if missing:
        raise UserError(f"{archive} has no member {sorted(missing)[0]!r}")


def _join(parts: Sequence[Path], dest: Path) -> int:
    """Concatenate text files (each ending in a newline) atomically; returns the lines."""
    tmp = dest.with_name(f".{dest.name}.part")
    lines = 0
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as src:
                for line in src:
                    out.write(line if line.endswith(b"\n") else line + b"\n")
                    lines += 1
    _replace_durably(tmp, dest)
    return lines


def _replace_durably(tmp: Path, dest: Path) -> None:
    """Give ``tmp``'s finished contents the name ``dest``: its data reaches the disk before
    the rename, and the rename before this returns, so a power cut leaves the old file or the
    whole new one."""
    fsync_path(tmp)
    os.replace(tmp, dest)
    fsync_path(dest.parent)


def _count_lines(path: Path) -> int:
    """Lines of a text file, the last one counted with or without its newline."""
    lines, last = 0, b"\n"
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(BLOCK), b""):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def prepare_wmt14_en_de(
    out: str | os.PathLike[str],
    *,
    cache: str | os.PathLike[str] | None = None,
    corpora: Sequence[Corpus] = WMT14_EN_DE,
    eval_files: Callable[[str, str], tuple[str, str]] | None = None,
    log: Log = print,
) -> dict[str, int]:
    """WMT14 English-German in ``out`` (module docstring): ``train.{en,de}``,
    ``valid.{en,de}`` (newstest2013) and ``test.{en,de}`` (newstest2014), plain text, line
    aligned.  Returns each split's line count.  ``corpora`` and ``eval_files`` (None:
    sacreBLEU's source and reference files of a test set) are for tests, which serve
    stand-ins from a local server."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    cache_dir = Path(cache) if cache is not None else default_cache() / "wmt14"
    extracted = cache_dir / "extracted"
    extracted.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    english, german = [], []
    for corpus in corpora:
        en = extracted / corpus.english.replace("/", "_")
        de = extracted / corpus.german.replace("/", "_")
        if not (en.is_file() and de.is_file()):
            archive = fetch(corpus.archive, cache_dir, log=log)
            log(f"extracting {corpus.english} and {corpus.german} from {archive.name}")
            _extract_members(archive, (corpus.english, corpus.german), (en, de))
        n_en, n_de = _count_lines(en), _count_lines(de)
        if n_en != n_de:
            raise UserError(f"{corpus.archive.name}: {n_en} English lines but {n_de} German")
        english.append(en)
        german.append(de)
    for lang, parts in (("en", english), ("de", german)):
        dest = folder / f"train.{lang}"
        if not dest.is_file():
            log(f"joining {len(parts)} corpora into {dest}")
            _join(parts, dest)
    counts["train"] = _count_lines(folder / "train.en")
    files = eval_files or _sacrebleu_files
    for split, (test_set, pair) in WMT14_EVAL.items():
        src, ref = files(test_set, pair)
        for path, lang in ((src, "en"), (ref, "de")):
            dest = folder / f"{split}.{lang}"
            if not dest.is_file():
                _join([Path(path)], dest)
        counts[split] = _count_lines(folder / f"{split}.en")
    return counts


def _sacrebleu_files(test_set: str, langpair: str) -> tuple[str, str]:
    """The plain-text source and reference of a sacreBLEU test set (downloaded by sacreBLEU
    into its own cache, with its own checks)."""
    from sacrebleu.utils import get_reference_files, get_source_file

    return get_source_file(test_set, langpair), get_reference_files(test_set, langpair)[0]
