"""The fp32 decoding products inside a compiled step (aiayn/nn/fp32_kernels.py): the graph
holds them, they give the eager block's numbers, and a step captured in one decoding block
runs in the next without a recompile."""

from __future__ import annotations

import pytest
import torch

from aiayn.nn.cpu_decoding import for_decoding
from aiayn.nn.fp32_kernels import packed_linear
from aiayn.nn.linear import Linear
from tests.conftest import fake_decoding_probes

# kernel -> the probes' answers that choose it (F.linear's seconds, the kernel's) and its rows
CHOSEN = {
    "packed_linear": ({"gemv": (1.0, 2.0), "packed": (2.0, 1.0)}, 4),  # a beam of four
    "gemv_linear": ({"gemv": (2.0, 1.0), "packed": (1.0, 2.0)}, 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("kernel", list(CHOSEN))
def test_a_captured_step_holds_the_eager_kernel_across_blocks(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes, rows = CHOSEN[kernel]
    fake_decoding_probes(monkeypatch, **probes)
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(32, 64), torch.nn.ReLU(), Linear(64, 16))
    x = torch.randn(rows, 32)  # (N, I)
    torch._dynamo.reset()
    step = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad():
        with for_decoding(model, rows):
            explained = torch._dynamo.explain(model)(x)
            eager, captured = model(x), step(x)
        # the same kernel on the same weights: the same numbers, bit for bit
        assert torch.equal(captured, eager)
        assert explained.graph_break_count == 0
        assert str(explained.graphs[0].code).count(f"aiayn.{kernel}") == 2
        # a new block makes its kernels' weights anew; the step runs as it was captured
        with for_decoding(model, rows), torch.compiler.set_stance("fail_on_recompile"):
            assert torch.equal(step(x), eager)


def test_a_packed_weight_dies_with_its_block(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_decoding_probes(monkeypatch, gemv=(1.0, 2.0), packed=(2.0, 1.0))
    layer, x = Linear(32, 64), torch.randn(4, 32)
    with torch.no_grad():
        with for_decoding(layer, 4):
            handle = layer.packed_handle
            assert torch.equal(packed_linear(x, layer.weight, layer.bias, handle), layer(x))
        assert "packed_handle" not in vars(layer)  # the block took its attributes away
        with pytest.raises(RuntimeError, match="outside its decoding block"):  # and its weights
            packed_linear(x, layer.weight, layer.bias, handle)


@pytest.mark.slow
def test_under_autocast_a_captured_step_takes_the_plain_product(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under CPU autocast the eager step leaves the product to ``F.linear`` (bf16); the
    captured one must too, not hand fp32 rows to an fp32 kernel."""
    fake_decoding_probes(monkeypatch, gemv=(1.0, 2.0), packed=(2.0, 1.0))
    model = torch.nn.Sequential(Linear(32, 64), torch.nn.ReLU(), Linear(64, 16))
    x = torch.randn(4, 32)
    torch._dynamo.reset()
    with torch.no_grad(), for_decoding(model, 4), torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(model)(x)
        eager = model(x)
        captured = torch.compile(model, fullgraph=True, dynamic=False)(x)
    assert "aiayn." not in str(explained.graphs[0].code)
    assert captured.dtype == eager.dtype == torch.bfloat16
