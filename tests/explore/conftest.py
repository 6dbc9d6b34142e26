"""A running explorer over four small models: a char-level language model checkpoint, a BPE
translation checkpoint (untrained: its translations are noise, its shapes are real), an
untrained preset and an untrained Vision Transformer checkpoint.  The server runs in a thread for the whole test session."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from aiayn.checkpoint import TOKENIZER_FILE, save, save_bundle
from aiayn.config import ModelConfig, get_preset
from aiayn.data.tokenizer import BPETokenizer, CharTokenizer, LabelTokenizer
from aiayn.explore.registry import PRESET_CHARS, Registry
from aiayn.models import build_model

SMALL = {"n_layers": 2, "d_model": 32, "attention.n_heads": 4, "ffn.d_ff": 64, "max_len": 64}


def make_checkpoints(root: Path) -> Registry:
    torch.manual_seed(0)
    chars = CharTokenizer(PRESET_CHARS)
    lm = build_model(get_preset("gpt2-small", vocab_size=chars.vocab_size, pad_id=None, **SMALL))
    save(lm, root / "lm")
    chars.save(root / "lm" / TOKENIZER_FILE)
    bpe = BPETokenizer.from_text("ein hund läuft\na dog runs\nzwei katzen\ntwo cats\n" * 20, 300)
    mt = build_model(get_preset("paper-base", vocab_size=bpe.vocab_size, **SMALL))
    save(mt, root / "mt")
    bpe.save(root / "mt" / TOKENIZER_FILE)
    reg = Registry()
    reg.add_checkpoint(root / "lm", "tiny-lm")
    reg.add_checkpoint(root / "mt", "tiny-mt")
    reg.add_preset("bert-base", **SMALL)
    vit = build_model(
        ModelConfig.from_dict(
            {
                "arch": "encoder",
                "vision.image_size": 8,
                "vision.patch_size": 2,
                "vision.channels": 1,
                "vision.n_classes": 10,
                "n_layers": 2,
                "d_model": 16,
                "attention.n_heads": 2,
                "ffn.d_ff": 32,
                "norm_position": "pre",
                "vocab_size": 10,
            }
        )
    )
    data = {"images": "digits", "test_fraction": 0.2, "seed": 0}
    save_bundle(root / "vit", vit, LabelTokenizer([str(i) for i in range(10)]), {"data": data})
    reg.add_checkpoint(root / "vit", "tiny-vit")
    return reg


class Client:
    def __init__(self, base: str) -> None:
        self.base = base

    def request(self, path: str, body: bytes | str | dict | None = None) -> tuple[int, dict]:
        data = None
        if body is not None:
            data = json.dumps(body).encode() if isinstance(body, dict) else body
            data = data.encode() if isinstance(data, str) else data
        req = urllib.request.Request(
            self.base + path, data=data, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"{}")


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    return make_checkpoints(tmp_path_factory.mktemp("explore"))


@pytest.fixture(scope="session")
def server(registry: Registry) -> Iterator[str]:
    import uvicorn

    from aiayn.explore.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(
        create_app(registry, max_chars=200), host="127.0.0.1", port=port, log_level="warning"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the explorer did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def client(server: str) -> Client:
    return Client(server)
