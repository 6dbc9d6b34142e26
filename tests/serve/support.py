"""What the serving tests share: an app served on a real socket, a bounded wait, and the
decoder-only model kinds they compare with offline generation.

Each positional scheme meets the pool's per-row positions in its own code (learned: an
embedding lookup; RoPE: rotated queries and keys; ALiBi: a bias from query and key
positions), and grouped-query attention shares each key/value head between query heads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import uvicorn
from fastapi import FastAPI

import aiayn
from aiayn.models import DecoderLM

# name -> (preset, overrides)
KINDS: dict[str, tuple[str, dict[str, object]]] = {
    "learned": ("gpt2-small", {}),
    "rope": ("gpt2-small", {"positions.scheme": "rope"}),
    "alibi": ("gpt2-small", {"positions.scheme": "alibi"}),
    # RoPE, RMSNorm, SwiGLU, 2 KV heads
    "gqa-llama": ("llama-style-small", {"attention.n_kv_heads": 2}),
}


def tiny_lm(kind: str, vocab_size: int, max_len: int = 64) -> DecoderLM:
    """A 2-layer, 32-wide model of ``kind`` (4 query heads), the same for the same arguments."""
    preset, extra = KINDS[kind]
    torch.manual_seed(0)
    m = aiayn.build_model(
        preset,
        n_layers=2,
        d_model=32,
        attention={"n_heads": 4},
        ffn={"d_ff": 64},
        vocab_size=vocab_size,
        max_len=max_len,
        dropout=0.0,
        **extra,
    )
    assert isinstance(m, DecoderLM)
    return m.eval()


@torch.no_grad()
def sharpen(m: DecoderLM, std: float = 0.3) -> DecoderLM:
    """Redraw every weight matrix of ``m`` with a large ``std``, in place.

    At the usual 0.02 an untrained model's attention is nearly uniform and its next token
    hardly depends on positions: a token-for-token comparison missed a RoPE position taken
    from the wrong row.  With 0.3 the attention logits span several units, and a position
    off in one row changes that row's greedy tokens."""
    g = torch.Generator().manual_seed(1)
    for p in m.parameters():
        if p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return m


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """``app`` on a real socket (a free port on 127.0.0.1), in a thread."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def wait_until(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    """Wait for ``condition`` (polled); fail with ``what`` if it has not held in ``timeout``
    seconds.  The timeout only bounds a hang: no result depends on how fast the host is."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)
