"""Downloads against a local HTTP server: checksums, the cache, resuming a broken transfer,
and the WMT14 recipe on stand-in archives (tests never reach the internet)."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from aiayn.data.download import Corpus, Remote, fetch, prepare_wmt14_en_de


class Handler(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` (name -> bytes) with Range support, except for the names in
    ``no_range`` (a server that ignores Range: 200 and the whole body); the first request for
    a name in ``cut`` sends only that many bytes and drops the connection."""

    files: ClassVar[dict[str, bytes]] = {}
    no_range: ClassVar[set[str]] = set()
    cut: ClassVar[dict[str, int]] = {}
    requests: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        name = self.path.lstrip("/")
        rng = self.headers.get("Range")
        self.requests.append((name, rng))
        if name not in self.files:
            self.send_error(404)
            return
        body, start = self.files[name], 0
        if rng and name not in self.no_range:
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        if name in self.cut:
            self.wfile.write(body[start : start + self.cut.pop(name)])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body[start:])

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Handler.files, Handler.cut, Handler.requests, Handler.no_range = {}, {}, [], set()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def remote(base: str, name: str, body: bytes) -> Remote:
    Handler.files[name] = body
    return Remote(f"{base}/{name}", hashlib.sha256(body).hexdigest(), len(body))


def test_a_download_is_checked_cached_and_resumed(server: str, tmp_path: Path) -> None:
    body = bytes(range(256)) * 5000  # 1.28 MB
    r = remote(server, "corpus.tgz", body)
    Handler.cut["corpus.tgz"] = 300_000  # the first connection breaks after 300 kB
    got = fetch(r, tmp_path, log=lambda _: None)
    assert got.read_bytes() == body
    assert Handler.requests == [("corpus.tgz", None), ("corpus.tgz", "bytes=300000-")]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".corpus.tgz.verified", "corpus.tgz"]
    # in the cache: no request, even with the server gone
    Handler.files.clear()
    assert fetch(r, tmp_path, log=lambda _: None) == got and len(Handler.requests) == 2


def test_a_partial_download_left_by_a_killed_run_resumes(server: str, tmp_path: Path) -> None:
    body = b"0123456789" * 1000
    r = remote(server, "a.gz", body)
    (tmp_path / "a.gz.part").write_bytes(body[:4321])
    assert fetch(r, tmp_path, log=lambda _: None).read_bytes() == body
    assert Handler.requests == [("a.gz", "bytes=4321-")]


def test_a_server_that_ignores_range_makes_the_download_start_over(
    server: str, tmp_path: Path
) -> None:
    """Asked for the rest, a server without Range support sends the whole file (200): the
    download starts the file again instead of appending it to what it already has."""
    body = b"0123456789" * 1000
    r = remote(server, "a.gz", body)
    Handler.no_range.add("a.gz")
    (tmp_path / "a.gz.part").write_bytes(body[:4321])
    assert fetch(r, tmp_path, log=lambda _: None).read_bytes() == body
    assert Handler.requests == [("a.gz", "bytes=4321-")]


def test_a_wrong_checksum_or_size_deletes_the_download(server: str, tmp_path: Path) -> None:
    good = remote(server, "f.gz", b"hello multi30k")
    with pytest.raises(ValueError, match="checksum mismatch for .*f.gz"):
        fetch(Remote(good.url, "0" * 64), tmp_path, log=lambda _: None)
    big = remote(server, "big.gz", b"x" * 1_000_000)  # declared 10 bytes: one more is read
    with pytest.raises(ValueError, match="11 bytes arrived, expected 10"):
        fetch(Remote(big.url, big.sha256, 10), tmp_path, log=lambda _: None)
    with pytest.raises(ValueError, match="14 bytes arrived, expected 99"):
        fetch(Remote(good.url, good.sha256, 99), tmp_path, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match=r"cannot download .*missing.gz.*run again to resume"):
        fetch(Remote(f"{server}/missing.gz", "0" * 64), tmp_path, attempts=1, log=lambda _: None)


def tgz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_the_wmt14_recipe_joins_the_corpora_and_the_test_sets(server: str, tmp_path: Path) -> None:
    """Stand-ins for the three archives (the real members' names) and for sacreBLEU's test
    sets: train.{en,de} hold the corpora in order, a second run takes everything from the
    cache and the finished files."""
    corpora = []
    for i, (en, de) in enumerate(
        [
            ("training/europarl-v7.de-en.en", "training/europarl-v7.de-en.de"),
            ("commoncrawl.de-en.en", "commoncrawl.de-en.de"),
        ]
    ):
        body = tgz({en: f"hello {i}\nworld {i}\n".encode(), de: f"hallo {i}\nwelt {i}".encode()})
        corpora.append(Corpus(remote(server, f"c{i}.tgz", body), en, de))
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("wmt13", "wmt14"):
        (tests / f"{name}.en").write_text(f"{name} source\n")
        (tests / f"{name}.de").write_text(f"{name} reference\n")

    def eval_files(test_set: str, pair: str) -> tuple[str, str]:
        assert pair == "en-de"
        return str(tests / f"{test_set}.en"), str(tests / f"{test_set}.de")

    out, cache = tmp_path / "wmt14", tmp_path / "cache"
    counts = prepare_wmt14_en_de(
        out, cache=cache, corpora=corpora, eval_files=eval_files, log=lambda _: None
    )
    assert counts == {"train": 4, "valid": 1, "test": 1}
    assert (out / "train.en").read_text() == "hello 0\nworld 0\nhello 1\nworld 1\n"
    assert (out / "train.de").read_text() == "hallo 0\nwelt 0\nhallo 1\nwelt 1\n"
    assert (out / "test.de").read_text() == "wmt14 reference\n"
    Handler.files.clear()
    assert (
        prepare_wmt14_en_de(
            out, cache=cache, corpora=corpora, eval_files=eval_files, log=lambda _: None
        )
        == counts
    )
    bad = Corpus(
        remote(server, "bad.tgz", tgz({"x.en": b"a\nb\n", "x.de": b"a\n"})), "x.en", "x.de"
    )
    with pytest.raises(ValueError, match="bad.tgz: 2 English lines but 1 German"):
        prepare_wmt14_en_de(
            tmp_path / "o2", cache=cache, corpora=[bad], eval_files=eval_files, log=lambda _: None
        )


def test_joined_and_extracted_files_reach_the_disk_before_their_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each finished file is fsynced, then renamed, then its folder fsynced (a power cut leaves
    the old file or the whole new one)."""
    from aiayn.data import download

    synced: list[str] = []
    monkeypatch.setattr(download, "fsync_path", lambda p: synced.append(Path(p).name))
    (tmp_path / "a.txt").write_text("one\ntwo")
    assert download._join([tmp_path / "a.txt"], tmp_path / "joined.txt") == 2
    archive = tmp_path / "c.tgz"
    archive.write_bytes(tgz({"m/x.de": b"eins\n"}))
    download._extract_members(archive, ["m/x.de"], [tmp_path / "x.de"])
    assert synced == [".joined.txt.part", tmp_path.name, ".x.de.part", tmp_path.name]
