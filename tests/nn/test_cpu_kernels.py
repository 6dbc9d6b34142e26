"""The CPU kernels equal F.linear, are applied only inside their blocks, measure only on entry,
and can be turned off (aiayn/nn/cpu_kernels.py)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import aiayn.nn.cpu_decoding as decoding
import aiayn.nn.cpu_kernels as kernels
from aiayn.nn.cpu_decoding import DecodingLinear, for_decoding
from aiayn.nn.cpu_kernels import (
    MIN_ROWS,
    ROW_MULTIPLE,
    TrainingLinear,
    choose_training_kernel,
    for_training,
)
from aiayn.nn.linear import Linear
from tests.conftest import fake_decoding_probes


def _two_layers() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(Linear(32, 64), Linear(64, 16))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "shape", [(64, 24), (3, 20, 24), (MIN_ROWS - 1, 24), (2 * ROW_MULTIPLE + 5, 24), (3, 50, 24)]
)
def test_onednn_training_equals_f_linear_forward_and_gradients(
    bias: bool, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    layer = Linear(24, 40, bias=bias)
    x = torch.randn(*shape, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_(True)
    w = layer.weight.detach().clone().requires_grad_(True)
    b = layer.bias.detach().clone().requires_grad_(True) if bias else None
    ref = F.linear(ref_x, w, b)
    probe = torch.randn_like(ref)
    with for_training(layer, "onednn"):
        out = layer(x)
        (out * probe).sum().backward()
    (ref * probe).sum().backward()
    # fp32, oneDNN's summation order: 40 x 2^-23 ~ 5e-6 for the 24- and 40-term sums.
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, ref_x.grad, atol=1e-5, rtol=1e-5)  # as out
    # Sums over up to 150 rows: values ~sqrt(150) ~ 12, off by ~sqrt(150) x 12 x 2^-23 ~ 2e-5.
    torch.testing.assert_close(layer.weight.grad, w.grad, atol=1e-4, rtol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad, b.grad, atol=1e-4, rtol=1e-5)  # as weight


def test_onednn_runs_only_inside_a_training_block_that_chose_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    original = kernels._OneDNNProducts.apply
    monkeypatch.setattr(
        kernels._OneDNNProducts, "apply", lambda *a: calls.append(1) or original(*a)
    )
    layer = Linear(8, 8)
    x = torch.randn(200, 8)
    layer(x)
    with for_training(layer, "mkl"):
        assert type(layer) is TrainingLinear
        layer(x)
    assert not calls
    with for_training(layer, "onednn"):
        layer(x)
    assert calls if kernels.HAS_ONEDNN else not calls
    assert type(layer) is Linear and "onednn" not in vars(layer)  # restored on exit
    layer(x)
    assert len(calls) <= 1


def test_a_block_keeps_parameters_state_dict_and_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_decoding_probes(monkeypatch, gemv=(2.0, 1.0), packed=(2.0, 1.0))
    model = _two_layers()
    params, keys = list(model.parameters()), list(model.state_dict())
    seen: list[int] = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.shape[0]))
    for block in (for_training(model, "onednn"), for_decoding(model, 4)):
        with block:
            assert all(isinstance(m, Linear) for m in model)
            assert list(model.parameters()) == params and list(model.state_dict()) == keys
            with torch.no_grad():
                model(torch.randn(4, 32))
        assert all(type(m) is Linear for m in model)
    assert seen == [4, 4]


def test_bf16_training_pads_rows_so_token_batches_meet_few_shapes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under CPU autocast with gradients, F.linear (oneDNN in bf16, a kernel kept per shape)
    sees row counts padded to ROW_MULTIPLE; the result and the gradients are those of the
    unpadded product.  Outside a training block nothing is padded."""
    torch.manual_seed(0)
    layer = Linear(24, 40)
    seen: list[int] = []
    plain = F.linear

    def recording(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        seen.append(x.shape[0] if x.dim() == 2 else -1)
        return plain(x, w, b)

    monkeypatch.setattr(kernels.F, "linear", recording)
    with for_training(layer, "mkl"):
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
        assert len(seen) == 28
        assert set(seen) <= {2 * ROW_MULTIPLE, 3 * ROW_MULTIPLE, 4 * ROW_MULTIPLE}
        seen.clear()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            layer(torch.randn(ROW_MULTIPLE + 3, 24))  # inference: no padding
        assert seen == [ROW_MULTIPLE + 3]


def test_the_onednn_probe_measures_without_touching_the_global_rng() -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    speedup = kernels.onednn_speedup(64, 16, 32)
    assert torch.equal(torch.rand(3), expected)  # training's random stream is unchanged
    assert speedup > 0 if kernels.HAS_ONEDNN else speedup == 0


def test_the_training_choice_follows_the_setting_the_probe_and_the_switch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kernels, "onednn_speedup", lambda *a: 1.5)
    kernel, why = choose_training_kernel("auto", 512, 64, cpu_fp32=True)
    assert kernel == "onednn" and why is not None and "1.50x" in why and "(512, 64)" in why
    assert choose_training_kernel("auto", 512, 64, cpu_fp32=False) == ("mkl", None)
    assert choose_training_kernel("auto", None, 64, cpu_fp32=True) == ("mkl", None)
    assert choose_training_kernel("onednn", 512, 64, cpu_fp32=True) == ("onednn", None)
    monkeypatch.setattr(kernels, "onednn_speedup", lambda *a: 1.02)
    assert choose_training_kernel("auto", 512, 64, cpu_fp32=True)[0] == "mkl"
    with pytest.raises(ValueError, match="'blas'.*'auto', 'mkl' or 'onednn'"):
        choose_training_kernel("blas", 512, 64, cpu_fp32=True)
    with pytest.raises(ValueError, match="'blas'"), for_training(Linear(4, 4), "blas"):
        pass
    monkeypatch.setenv("AIAYN_CPU_KERNELS", "off")
    assert choose_training_kernel("onednn", 512, 64, cpu_fp32=True)[0] == "mkl"


def test_off_leaves_every_layer_on_f_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe(*args: object) -> tuple[float, float]:
        raise AssertionError("measured with AIAYN_CPU_KERNELS=off")

    monkeypatch.setattr(decoding, "_decode_seconds", no_probe)
    monkeypatch.setattr(decoding, "_GEMV_SECONDS", {})
    monkeypatch.setattr(decoding, "_gemv_seconds", no_probe)
    monkeypatch.setenv("AIAYN_CPU_KERNELS", "off")
    model = _two_layers()
    with for_decoding(model, 8) as plan, torch.no_grad():
        assert plan == decoding.DecodingPlan(gemv=False, packed=0)
        assert all(type(m) is Linear for m in model)
    with for_training(model, "onednn"):
        assert all(type(m) is Linear for m in model)


def test_packed_decoding_equals_f_linear_and_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    # packing faster, gemv not
    fake_decoding_probes(monkeypatch, gemv=(1.0, 2.0), packed=(2.0, 1.0))
    model = torch.nn.Sequential(Linear(32, 64), torch.nn.ReLU(), Linear(64, 16))
    x1, x8 = torch.randn(1, 32), torch.randn(8, 5, 32)
    with torch.no_grad():
        expected1, expected8 = model(x1), model(x8)
        with for_decoding(model, 8) as plan:
            layers = [m for m in model if isinstance(m, Linear)]
            assert plan.packed == 2 and not plan.gemv
            assert all(type(m) is DecodingLinear and m.packed is not None for m in layers)
            # fp32, packed oneDNN's summation order: 64 x 2^-23 ~ 8e-6 for a 64-term sum.
            torch.testing.assert_close(model(x1), expected1, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(model(x8), expected8, atol=1e-5, rtol=1e-5)  # as x1
    assert all(type(m) is not DecodingLinear and "packed" not in vars(m) for m in model)
    with for_decoding(model, 8):  # with gradients the packed copy is never used
        model(x8).sum().backward()
    assert model[0].weight.grad is not None


def test_one_row_in_a_decoding_block_uses_views_made_once_and_equals_f_linear(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_decoding_probes(monkeypatch, gemv=(2.0, 1.0), packed=(1.0, 2.0))
    torch.manual_seed(0)
    model = torch.nn.Sequential(Linear(48, 40), Linear(40, 24, bias=False))
    x = torch.randn(1, 1, 48)
    with torch.no_grad(), for_decoding(model, 1) as plan:
        assert plan.gemv and plan.packed == 0
        assert all(m.row_view is not None and m.packed is None for m in model)
        views = [m.row_view for m in model]
        torch.testing.assert_close(
            model(x), F.linear(F.linear(x, *model[0].parameters()), model[1].weight)
        )
        assert [m.row_view for m in model] == views  # not remade per call
        model[0].weight.mul_(-2.0)  # in place: the views share the parameters' memory
        model[0].bias.add_(1.0)
        torch.testing.assert_close(model[0](x), F.linear(x, model[0].weight, model[0].bias))
        with for_decoding(model, 1):
            assert [m.row_view for m in model] == views  # an inner block keeps the outer's
        assert [m.row_view for m in model] == views
        two = torch.randn(2, 48)  # several rows: not the one-row path
        torch.testing.assert_close(model[0](two), F.linear(two, model[0].weight, model[0].bias))
    assert all(type(m) is Linear for m in model)
    assert model[0](x).requires_grad  # outside no_grad the autograd path is taken


def test_decoding_blocks_nest_and_the_outer_one_owns_the_packing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_decoding_probes(monkeypatch, gemv=(1.0, 2.0), packed=(2.0, 1.0))
    model = _two_layers()
    with torch.no_grad(), for_decoding(model, 8):
        packed = [m.packed for m in model]
        with for_decoding(model, 4):
            assert [m.packed for m in model] == packed  # the same tensors: not packed again
        assert [m.packed for m in model] == packed  # the inner block left them in place
    assert all(type(m) is Linear for m in model)


@pytest.mark.parametrize("kernel", ["gemv", "packed"])
def test_the_decoding_probe_measures_both_kernels_against_f_linear(kernel: str) -> None:
    speedup = decoding.decode_speedup(kernel, 1 if kernel == "gemv" else 4, 48, 40)
    if kernel == "packed" and not kernels.HAS_ONEDNN:
        assert speedup == 0
    else:
        assert 0 < speedup < float("inf")
    with pytest.raises(ValueError, match="'gemv' or 'packed'"):
        decoding.decode_speedup("blas", 1, 48, 40)


def test_a_decoding_block_packs_per_shape_and_takes_gemv_for_all_layers_or_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The host decides, on entry.  Packing, per weight shape: here it wins only for the
    32 -> 64 weight.  gemv, for the whole model: its one-row products must take less time in
    all (a model that mixed gemv with F.linear would spin two thread pools against each
    other).  Each decision is logged once."""
    seconds = {("packed", 32, 64): (2.0, 1.0), ("packed", 64, 16): (1.0, 2.0)}
    calls: list[tuple[str, int, int, int]] = []

    def probe(kernel: str, rows: int, d_in: int, d_out: int) -> tuple[float, float]:
        calls.append((kernel, rows, d_in, d_out))
        return seconds[kernel, d_in, d_out]

    passes: list[list[tuple[int, int]]] = []
    whole = {"seconds": (3.0, 2.5)}  # a one-row pass: (F.linear, gemv)

    def pass_probe(layers: list[Linear]) -> tuple[float, float]:
        passes.append([(m.in_features, m.out_features) for m in layers])
        return whole["seconds"]

    monkeypatch.setattr(decoding, "_decode_seconds", probe)
    monkeypatch.setattr(decoding, "_GEMV_SECONDS", {})
    monkeypatch.setattr(decoding, "_gemv_seconds", pass_probe)
    kernels.log_once.cache_clear()
    model = _two_layers()
    with caplog.at_level(logging.INFO, "aiayn.cpu_kernels"):
        with torch.no_grad(), for_decoding(model, 8) as plan:
            assert model[0].packed is not None and model[1].packed is None and plan.packed == 1
            assert ("packed", 8, 32, 64) in calls
            assert passes == [[(32, 64), (64, 16)]]  # the whole model's pass, in order
            assert plan.gemv  # 2.5 s through gemv against 3 s: all on gemv
            for rows in (8, 1):
                x = torch.randn(rows, 32)
                expected = F.linear(F.linear(x, *model[0].parameters()), *model[1].parameters())
                torch.testing.assert_close(model(x), expected)
        with torch.no_grad(), for_decoding(model, 8):
            assert len(passes) == 1  # measured once per list of shapes and process
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "one-row decoding of 2 linear layers",
        "decoding 8 rows",
    ]  # logged once each, though the block was entered twice
    whole["seconds"] = (3.0, 3.5)
    monkeypatch.setattr(decoding, "_GEMV_SECONDS", {})
    with torch.no_grad(), for_decoding(model, 1) as plan:  # 3.5 s against 3 s: F.linear for all
        assert all(m.row_view is None and m.packed is None for m in model)
        assert not plan.gemv


def test_a_block_that_rejects_gemv_for_the_model_keeps_every_one_row_product_off_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gemv may win for one shape alone but lose over the model's pass: inside the block no
    layer may take it (its thread pool would spin beside torch's)."""
    fake_decoding_probes(monkeypatch, gemv=(3.0, 3.5), packed=(1.0, 2.0))

    def no_gemv(*args: object) -> None:
        raise AssertionError("gemv taken inside a block that rejected it for the model")

    model = _two_layers()
    x = torch.randn(1, 32)
    with torch.no_grad(), for_decoding(model, 1):
        monkeypatch.setattr(decoding, "gemv", no_gemv)
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
    real_gemv, real_linear = decoding.gemv, decoding.F.linear

    def gemv(x: Tensor, w_t: np.ndarray, b: np.ndarray | None) -> Tensor:
        gemv_calls.append(w_t)
        return real_gemv(x, w_t, b)

    def linear(x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
        linear_calls.append(w)
        return real_linear(x, w, b)

    monkeypatch.setattr(decoding, "gemv", gemv)
    monkeypatch.setattr(decoding.F, "linear", linear)
    baseline, by_gemv = decoding._gemv_seconds(list(model), budget_s=0.0)
    assert 0 < baseline < 1 and 0 < by_gemv < 1  # microseconds a pass: 1 s catches a broken timer
    passes = 1 + 3  # the warm-up, then the fewest rounds
    assert len(gemv_calls) == len(linear_calls) == 2 * passes
    for i, m in enumerate(model):  # the layers' own weights, not copies
        assert all(w is m.weight for w in linear_calls[i::2])
        assert all(np.shares_memory(w, m.weight.detach().numpy()) for w in gemv_calls[i::2])


def test_other_dtypes_and_autocast_take_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_decoding_probes(monkeypatch, gemv=(2.0, 1.0), packed=(2.0, 1.0))
    layer = Linear(16, 8).double()
    with for_decoding(layer, 4) as plan, torch.no_grad():
        assert type(layer) is Linear and plan.packed == 0  # fp64: not the kernels' domain
    layer32 = Linear(16, 8)
    with for_decoding(layer32, 4), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer32(torch.randn(32, 16)).dtype == torch.bfloat16
