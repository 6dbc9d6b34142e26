"""torch.compile sees each block of a training forward pass as one graph, with no graph
breaks (``train.compile = true`` compiles the model, aiayn/training/loop.py; the input checks
and the fused loss outside the blocks are left to eager mode)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import aiayn
from aiayn import registry
from aiayn.nn.blocks import Block


def _graphs_per_block(model: torch.nn.Module, *args: object, **kwargs: object) -> list[tuple]:
    """(graphs, breaks, reasons) of each block's forward as the model runs once in training."""
    found: list[tuple] = []
    forward = Block.forward

    def explained(self: Block, x: torch.Tensor, ctx: object) -> torch.Tensor:
        torch._dynamo.reset()
        e = torch._dynamo.explain(forward)(self, x, ctx)
        found.append((e.graph_count, e.graph_break_count, [r.reason for r in e.break_reasons]))
        return forward(self, x, ctx)

    Block.forward = explained  # type: ignore[method-assign]
    try:
        model.train()(*args, **kwargs)
    finally:
        Block.forward = forward  # type: ignore[method-assign]
        torch._dynamo.reset()
    return found


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
def test_a_training_block_is_one_graph(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # As in a fresh process, where the backend's module is not imported yet: importing it
    # inside the traced forward would break the graph.
    table = registry.REGISTRY["attention_backend"]
    monkeypatch.setitem(table, "sdpa", "aiayn.nn.attention:sdpa_backend")
    size = {
        "n_layers": 2,
        "d_model": 32,
        "attention.n_heads": 4,
        "ffn.d_ff": 64,
        "vocab_size": 50,
        "max_len": 32,
    }
    ids = torch.randint(1, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    if family == "decoder":
        model = aiayn.build_model("gpt2-small", **size, dropout=0.1)
        found = _graphs_per_block(model, ids, targets=ids)
    else:
        model = aiayn.build_model("paper-base", **size, dropout=0.1)
        src = ids.clone()
        src[0, 10:] = 0  # padding: the source key mask goes through the blocks too
        found = _graphs_per_block(model, src, ids, targets=ids, label_smoothing=0.1)
    assert len(found) == (2 if family == "decoder" else 4)
    assert all(f[:2] == (1, 0) for f in found), found
