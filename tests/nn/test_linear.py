"""The Linear layer's oneDNN path equals F.linear: forward, gradients, packed inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import aiayn.nn.linear as linear_module
from aiayn.nn.linear import (
    MIN_ROWS,
    ROW_MULTIPLE,
    Linear,
    gemv_views,
    packed_for_inference,
    packed_for_rows,
    use_onednn,
)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "shape", [(64, 24), (3, 20, 24), (MIN_ROWS - 1, 24), (2 * ROW_MULTIPLE + 5, 24), (3, 50, 24)]
)
def test_forward_and_gradients_equal_f_linear(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(*shape, requires_grad=True)
    with use_onednn():
        out = layer(x)
    ref_x = x.detach().clone().requires_grad_(True)
    w = layer.weight.detach().clone().requires_grad_(True)
    b = layer.bias.detach().clone().requires_grad_(True) if bias else None
    ref = F.linear(ref_x, w, b)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    probe = torch.randn_like(ref)
    with use_onednn():
        (out * probe).sum().backward()
    (ref * probe).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer.weight.grad, w.grad, atol=1e-4, rtol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad, b.grad, atol=1e-4, rtol=1e-5)


def test_is_a_drop_in_torch_linear() -> None:
    layer = Linear(8, 4)
    assert isinstance(layer, torch.nn.Linear)
    assert set(layer.state_dict()) == {"weight", "bias"}


def test_other_dtypes_and_autocast_take_the_plain_path() -> None:
    layer = Linear(16, 8).double()
    x = torch.randn(32, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    layer32 = Linear(16, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer32(torch.randn(32, 16)).dtype == torch.bfloat16


def test_bf16_training_pads_rows_so_token_batches_meet_few_shapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under CPU autocast with gradients, F.linear (oneDNN in bf16, a kernel kept per shape)
    sees row counts padded to ROW_MULTIPLE; the result and the gradients are those of the
    unpadded product."""
    torch.manual_seed(0)
    layer = Linear(24, 40)
    seen: list[int] = []
    plain = F.linear

    def recording(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        seen.append(x.shape[0] if x.dim() == 2 else -1)
        return plain(x, w, b)

    monkeypatch.setattr(linear_module.F, "linear", recording)
    for rows in range(ROW_MULTIPLE + 1, 4 * ROW_MULTIPLE + 1, 7):  # 28 token-batch sizes
        x = torch.randn(rows, 24, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = layer(x)
            ref = plain(x, layer.weight, layer.bias)
        assert out.shape == ref.shape == (rows, 40) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out, ref)
        (out.float() ** 2).sum().backward()
        grad_x, x.grad = x.grad, None
        (ref.float() ** 2).sum().backward()
        torch.testing.assert_close(grad_x, x.grad)
    assert len(seen) == 28 and set(seen) <= {2 * ROW_MULTIPLE, 3 * ROW_MULTIPLE, 4 * ROW_MULTIPLE}
    seen.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.randn(ROW_MULTIPLE + 3, 24))  # inference: no padding
    assert seen == [ROW_MULTIPLE + 3]


def test_packed_inference_equals_and_is_released() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(32, 64), torch.nn.ReLU(), Linear(64, 16))
    x1, x8 = torch.randn(1, 32), torch.randn(8, 5, 32)
    with torch.no_grad():
        expected1, expected8 = model(x1), model(x8)
        with packed_for_inference(model):
            assert all(m.packed is not None for m in model if isinstance(m, Linear))
            torch.testing.assert_close(model(x1), expected1, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(model(x8), expected8, atol=1e-5, rtol=1e-5)
    assert all(m.packed is None for m in model if isinstance(m, Linear))
    # With gradients enabled the packed copy is never used (it would not be trained).
    with packed_for_inference(model):
        out = model(x8)
        out.sum().backward()
    assert model[0].weight.grad is not None


def test_onednn_training_path_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = linear_module._OneDNNLinear.apply
    monkeypatch.setattr(
        linear_module._OneDNNLinear, "apply", lambda *a: calls.append(1) or original(*a)
    )
    layer = Linear(8, 8)
    x = torch.randn(200, 8)
    layer(x)
    assert not calls  # off by default: varied shapes would grow oneDNN's kernel caches
    with use_onednn():
        layer(x)
    if linear_module._ONEDNN:
        assert calls
    layer(x)
    assert len(calls) <= 1  # restored on exit


def test_the_onednn_probe_measures_without_touching_the_global_rng() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    speedup = linear_module.onednn_speedup(64, 16, 32)
    assert torch.equal(torch.rand(3), expected)  # training's random stream is unchanged
    assert speedup > 0 if linear_module._ONEDNN else speedup == 0


def test_one_row_without_gradients_takes_gemv_and_equals_f_linear() -> None:
    torch.manual_seed(0)
    layer = Linear(48, 40)
    x = torch.randn(1, 1, 48)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    assert layer(x).requires_grad  # with gradients it stays on the autograd path


def test_one_row_in_a_decoding_block_uses_views_made_once_and_equals_f_linear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linear_module, "_decode_seconds", lambda *a: (2.0, 1.0))  # gemv faster
    monkeypatch.setattr(linear_module, "_GEMV_SECONDS", {})
    monkeypatch.setattr(linear_module, "_gemv_seconds", lambda layers: (2.0, 1.0))
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(48, 40), Linear(40, 24, bias=False))
    x = torch.randn(1, 1, 48)
    with torch.no_grad(), packed_for_rows(model, 1):
        assert all(m.row_view is not None and m.packed is None for m in model)
        assert linear_module.on_gemv(model)
        views = [m.row_view for m in model]
        torch.testing.assert_close(
            model(x), F.linear(F.linear(x, *model[0].parameters()), model[1].weight)
        )
        assert [m.row_view for m in model] == views  # not remade per call
        model[0].weight.mul_(-2.0)  # in place: the views share the parameters' memory
        model[0].bias.add_(1.0)
        torch.testing.assert_close(model[0](x), F.linear(x, model[0].weight, model[0].bias))
        with gemv_views(model):
            assert [m.row_view for m in model] == views  # an inner block keeps the outer's
        assert [m.row_view for m in model] == views
        two = torch.randn(2, 48)  # several rows, gradients, autocast: not the one-row path
        torch.testing.assert_close(model[0](two), F.linear(two, model[0].weight, model[0].bias))
    assert all(m.row_view is None for m in model)
    y = model[0](x)
    assert y.requires_grad  # outside no_grad the autograd path is taken
    with torch.no_grad(), packed_for_inference(model, rows=4):  # packing makes the views too
        assert all(m.row_view is not None for m in model)
        torch.testing.assert_close(model[0](x), F.linear(x, model[0].weight, model[0].bias))


def test_packed_blocks_nest_and_the_outer_one_owns_the_packing() -> None:
    model = torch.nn.Sequential(Linear(32, 64), Linear(64, 16))
    with torch.no_grad(), packed_for_inference(model, rows=8):
        packed = [m.packed for m in model]
        with packed_for_inference(model, rows=4):
            assert [m.packed for m in model] == packed  # the same tensors: not packed again
        assert [m.packed for m in model] == packed  # the inner block left them in place
    assert all(m.packed is None for m in model)


@pytest.mark.parametrize("kernel", ["gemv", "packed"])
def test_the_decoding_probe_measures_both_kernels_against_f_linear(kernel: str) -> None:
    speedup = linear_module.decode_speedup(kernel, 1 if kernel == "gemv" else 4, 48, 40)
    if kernel == "packed" and not linear_module._ONEDNN:
        assert speedup == 0
    else:
        assert 0 < speedup < float("inf")
    with pytest.raises(ValueError, match="'gemv' or 'packed'"):
        linear_module.decode_speedup("blas", 1, 48, 40)


def test_a_decoding_block_packs_per_shape_and_takes_gemv_for_all_layers_or_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host decides.  Packing, per weight shape: here it wins only for the 32 -> 64
    weight.  gemv, for the whole model: its one-row products must take less time in all
    (a model that mixed gemv with F.linear would spin two thread pools against each other)."""
    seconds = {
        ("packed", 32, 64): (2.0, 1.0),  # (F.linear, the kernel)
        ("packed", 64, 16): (1.0, 2.0),
    }
    calls: list[tuple[str, int, int, int]] = []

    def probe(kernel: str, rows: int, d_in: int, d_out: int) -> tuple[float, float]:
        calls.append((kernel, rows, d_in, d_out))
        return seconds[kernel, d_in, d_out]

    passes: list[list[tuple[int, int]]] = []
    whole = {"seconds": (3.0, 2.5)}  # a one-row pass: (F.linear, gemv)

    def pass_probe(layers: list[Linear]) -> tuple[float, float]:
        passes.append([(m.in_features, m.out_features) for m in layers])
        return whole["seconds"]

    monkeypatch.setattr(linear_module, "_decode_seconds", probe)
    monkeypatch.setattr(linear_module, "_GEMV_SECONDS", {})
    monkeypatch.setattr(linear_module, "_gemv_seconds", pass_probe)
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(32, 64), Linear(64, 16))
    with torch.no_grad(), packed_for_rows(model, 8):
        assert model[0].packed is not None and model[1].packed is None
        assert ("packed", 8, 32, 64) in calls
        assert passes == [[(32, 64), (64, 16)]]  # the whole model's pass, in order
        assert linear_module.on_gemv(model)  # 2.5 s through gemv against 3 s: all on gemv
        for rows in (8, 1):
            x = torch.randn(rows, 32)
            expected = F.linear(F.linear(x, *model[0].parameters()), *model[1].parameters())
            torch.testing.assert_close(model(x), expected)
    assert all(m.packed is None and m.row_view is None for m in model)
    with torch.no_grad(), packed_for_rows(model, 1):
        assert len(passes) == 1  # measured once per list of shapes and process
    whole["seconds"] = (3.0, 3.5)
    monkeypatch.setattr(linear_module, "_GEMV_SECONDS", {})
    with torch.no_grad(), packed_for_rows(model, 1):  # 3.5 s against 3 s: F.linear for all
        assert all(m.row_view is None and m.packed is None for m in model)
        assert not linear_module.on_gemv(model)


def test_one_row_outside_a_block_skips_gemv_where_f_linear_measures_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linear_module, "_decode_seconds", lambda *a: (1.0, 2.0))  # F.linear faster
    monkeypatch.setattr(linear_module, "_GEMV_SECONDS", {})
    monkeypatch.setattr(linear_module, "_gemv_seconds", lambda layers: (1.0, 2.0))

    def no_gemv(*args: object) -> None:
        raise AssertionError("gemv taken where the probe found F.linear faster")

    monkeypatch.setattr(linear_module, "_gemv", no_gemv)
    layer = Linear(48, 40)
    x = torch.randn(1, 48)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        with packed_for_rows(layer, 1):
            assert layer.row_view is None
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_a_block_that_rejects_gemv_for_the_model_keeps_every_one_row_product_off_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gemv wins for one shape alone but loses over the model's pass: inside the block no
    layer may take it, not even through the one-row path outside blocks (its thread pool would
    spin beside torch's)."""
    seconds = {(32, 64): (2.0, 1.0), (64, 16): (1.0, 2.5)}  # (F.linear, gemv), shapes alone
    monkeypatch.setattr(linear_module, "_decode_seconds", lambda k, r, i, o: seconds[i, o])
    monkeypatch.setattr(linear_module, "_GEMV_SECONDS", {})
    monkeypatch.setattr(linear_module, "_gemv_seconds", lambda layers: (3.0, 3.5))

    def no_gemv(*args: object) -> None:
        raise AssertionError("gemv taken inside a block that rejected it for the model")

    model = torch.nn.Sequential(Linear(32, 64), Linear(64, 16))
    x = torch.randn(1, 32)
    with torch.no_grad(), packed_for_rows(model, 1):
        monkeypatch.setattr(linear_module, "_gemv", no_gemv)
        expected = F.linear(F.linear(x, *model[0].parameters()), *model[1].parameters())
        torch.testing.assert_close(model(x), expected)


def test_the_gemv_probe_times_one_row_passes_through_the_models_own_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each pass multiplies one row by every layer's weight once, in order, by each kernel;
    the passes alternate, and the answer is the median of each kernel's passes."""
    model = torch.nn.Sequential(Linear(32, 64), Linear(64, 16, bias=False))
    gemv_calls: list[np.ndarray] = []
    linear_calls: list[Tensor] = []
    real_gemv, real_linear = linear_module._gemv, linear_module.F.linear

    def gemv(x: Tensor, w_t: np.ndarray, b: np.ndarray | None) -> Tensor:
        gemv_calls.append(w_t)
        return real_gemv(x, w_t, b)

    def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        linear_calls.append(w)
        return real_linear(x, w, b)

    monkeypatch.setattr(linear_module, "_gemv", gemv)
    monkeypatch.setattr(linear_module.F, "linear", linear)
    baseline, by_gemv = linear_module._gemv_seconds(list(model), budget_s=0.0)
    assert 0 < baseline < 1 and 0 < by_gemv < 1
    passes = 1 + 3  # the warm-up, then the fewest rounds
    assert len(gemv_calls) == len(linear_calls) == 2 * passes
    for i, m in enumerate(model):  # the layers' own weights, not copies
        assert all(w is m.weight for w in linear_calls[i::2])
        assert all(np.shares_memory(w, m.weight.detach().numpy()) for w in gemv_calls[i::2])
