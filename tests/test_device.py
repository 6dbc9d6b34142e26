"""Devices and precisions are named, checked and explained; "auto" reads the machine."""

from __future__ import annotations

import pytest
import torch

from aiayn import device as dev


def test_auto_is_the_cpu_without_a_gpu_and_a_missing_gpu_is_explained() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert dev.resolve_device("auto") == torch.device("cpu")
    assert dev.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device 'cuda' was asked for, but CUDA is not available"):
        dev.resolve_device("cuda")
    with pytest.raises(ValueError, match="cuda:1"):
        dev.resolve_device("cuda:1")
    with pytest.raises(ValueError, match="device 'tpu' is invalid|not supported"):
        dev.resolve_device("tpu")


def test_dtypes_by_name_and_auto_from_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert dev.resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert dev.resolve_dtype("float16", cpu) == torch.float16
    with pytest.raises(ValueError, match="dtype 'half' is invalid"):
        dev.resolve_dtype("half", cpu)
    monkeypatch.setattr(dev, "cpu_has_bf16", lambda: False)
    assert dev.resolve_dtype("auto", cpu) == torch.float32  # no bf16 units: never emulate
    monkeypatch.setattr(dev, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(dev, "bf16_speedup", lambda: 2.5)
    assert dev.resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(dev, "bf16_speedup", lambda: 1.1)  # units, but no gain measured
    assert dev.resolve_dtype("auto", cpu) == torch.float32


def test_cpu_flags_are_read_from_the_processor() -> None:
    flags = dev.cpu_flags()
    assert isinstance(flags, frozenset)
    assert dev.cpu_has_bf16() == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    assert dev.matmul_gflops(64, repeat=1) > 0
