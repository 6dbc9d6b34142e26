"""The decoder-only model kinds the serving tests compare with offline generation.

Each positional scheme meets the pool's per-row positions in its own code (learned: an
embedding lookup; RoPE: rotated queries and keys; ALiBi: a bias from query and key
positions), and grouped-query attention shares each key/value head between query heads.
"""

from __future__ import annotations

import torch

import aiayn
from aiayn.models import DecoderLM

# name -> (preset, overrides)
KINDS: dict[str, tuple[str, dict[str, object]]] = {
    "learned": ("gpt2-small", {}),
    "rope": ("gpt2-small", {"positional": "rope"}),
    "alibi": ("gpt2-small", {"positional": "alibi"}),
    "gqa-llama": ("llama-style-small", {"n_kv_heads": 2}),  # RoPE, RMSNorm, SwiGLU, 2 KV heads
}


def tiny_lm(kind: str, vocab_size: int, max_len: int = 64) -> DecoderLM:
    """A 2-layer, 32-wide model of ``kind`` (4 query heads), the same for the same arguments."""
    preset, extra = KINDS[kind]
    torch.manual_seed(0)
    m = aiayn.build_model(preset, n_layers=2, d_model=32, n_heads=4, d_ff=64,
                          vocab_size=vocab_size, max_len=max_len, dropout=0.0,
                          **extra)  # fmt: skip
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
