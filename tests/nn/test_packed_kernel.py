"""The packed fp32 product inside a compiled step (aiayn/nn/packed_kernel.py): the graph holds
it, it gives the eager block's numbers, and a step captured in one decoding block runs in the
next without a recompile."""

from __future__ import annotations

import pytest
import torch

from aiayn.nn.cpu_decoding import for_decoding
from aiayn.nn.linear import Linear
from aiayn.nn.packed_kernel import packed_linear
from tests.conftest import fake_decoding_probes


@pytest.mark.slow
def test_a_captured_step_holds_the_packed_product_across_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_decoding_probes(monkeypatch, gemv=(1.0, 2.0), packed=(2.0, 1.0))  # packing faster
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(32, 64), torch.nn.ReLU(), Linear(64, 16))
    x = torch.randn(4, 32)  # (N, I): a beam of four
    torch._dynamo.reset()
    step = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        with for_decoding(model, 4):
            explained = torch._dynamo.explain(model)(x)
            eager, captured = model(x), step(x)
            handle = model[0].packed_handle
        # the same oneDNN kernel on the same packed weight: the same numbers, bit for bit
        assert torch.equal(captured, eager)
        assert explained.graph_break_count == 0
        assert str(explained.graphs[0].code).count("aiayn.packed_linear") == 2
        # a new block packs anew; the handles stay, so the captured step runs as it is
        with for_decoding(model, 4), torch.compiler.set_stance("fail_on_recompile"):
            assert torch.equal(step(x), eager)
    assert "packed_handle" not in vars(model[0])  # the block took its attributes away
    with pytest.raises(RuntimeError, match="outside its decoding block"):  # and its weights
        packed_linear(x, model[0].weight, model[0].bias, handle)
