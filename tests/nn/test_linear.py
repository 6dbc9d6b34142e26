"""The model's Linear is a plain linear layer: F.linear, nothing measured, nothing chosen."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import aiayn.device
import aiayn.nn.cpu_decoding as decoding
import aiayn.nn.cpu_kernels as kernels
from aiayn.nn.linear import Linear


def test_is_a_drop_in_torch_linear() -> None:
    layer = Linear(8, 4)
    assert isinstance(layer, torch.nn.Linear)
    assert set(layer.state_dict()) == {"weight", "bias"}


@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (3, 50, 24), (200, 24)])
def test_forward_is_f_linear_and_times_nothing(
    shape: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One row without gradients once went to a gemv probe timed inside ``forward``: no
    shape, with or without gradients, may measure anything or leave F.linear."""

    def no_timing(*args: object, **kwargs: object) -> float:
        raise AssertionError("Linear.forward timed a kernel")

    monkeypatch.setattr(aiayn.device, "best_seconds", no_timing)
    monkeypatch.setattr(kernels, "best_seconds", no_timing)
    monkeypatch.setattr(decoding, "best_seconds", no_timing)
    monkeypatch.setattr(decoding, "_gemv_seconds", no_timing)
    monkeypatch.setattr(decoding, "gemv", no_timing)
    torch.manual_seed(0)
    layer = Linear(24, 40)
    x = torch.randn(*shape)
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
