"""FlashAttention backend: equals the reference (outputs and gradients), masks, GQA, memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

import aiayn
from aiayn import scaled_dot_product_attention as sdpa
from aiayn.nn import flash
from aiayn.nn.flash import flash_attention

# fp32, tiles and online-softmax rescaling sum in another order: D<=16 x 2^-23 ~ 2e-6; 5x room.
ATOL = RTOL = 1e-5


@contextmanager
def small_tiles(block_q: int = 16, block_k: int = 32) -> Iterator[None]:
    """Small tiles through the public dispatcher, so odd lengths cross tile edges."""
    saved = flash.BLOCK_Q, flash.BLOCK_K
    flash.BLOCK_Q, flash.BLOCK_K = block_q, block_k
    try:
        yield
    finally:
        flash.BLOCK_Q, flash.BLOCK_K = saved


def _compare(
    shapes: tuple[tuple[int, ...], tuple[int, ...]],
    mask: torch.Tensor | None = None,
    **kwargs: object,
) -> None:
    """Flash (small tiles) == reference on the output and on dq, dk, dv."""
    q_shape, kv_shape = shapes
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=g) for s in (q_shape, kv_shape, kv_shape)]
    results = []
    for backend in ("reference", "flash"):
        q, k, v = (x.clone().requires_grad_(True) for x in inputs)
        with small_tiles():
            out = sdpa(q, k, v, mask, backend=backend, **kwargs)  # type: ignore[arg-type]
        assert isinstance(out, torch.Tensor)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        results.append([out, q.grad, k.grad, v.grad])
    for ref, fast in zip(*results, strict=True):
        assert fast is not None and not fast.isnan().any()
        torch.testing.assert_close(fast, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("t", "s"), [(37, 37), (50, 50), (1, 50), (37, 50), (32, 64)])
def test_equals_reference_causal_and_lengths(is_causal: bool, t: int, s: int) -> None:
    # T < S with is_causal is the KV-cache case: the queries are the last T positions.
    _compare(((2, 3, t, 16), (2, 3, s, 16)), is_causal=is_causal)


@pytest.mark.parametrize("window", [1, 5, 16, 40, 100])
def test_equals_reference_sliding_window(window: int) -> None:
    _compare(((2, 2, 50, 8), (2, 2, 50, 8)), window=window)
    _compare(((1, 2, 19, 8), (1, 2, 50, 8)), window=window)  # cached queries


@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_reference_key_padding(is_causal: bool) -> None:
    keep = torch.ones(3, 1, 1, 50, dtype=torch.bool)
    keep[0, ..., 40:] = False
    keep[1, ..., :7] = False  # left padding
    _compare(((3, 4, 37, 8), (3, 4, 50, 8)), keep, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_reference_general_boolean_mask(is_causal: bool) -> None:
    mask = torch.rand(2, 4, 37, 50, generator=torch.Generator().manual_seed(3)) > 0.4
    _compare(((2, 4, 37, 8), (2, 4, 50, 8)), mask, is_causal=is_causal)
    _compare(((2, 4, 37, 8), (2, 4, 50, 8)), mask[0, 0], is_causal=is_causal)  # (T, S) only


@pytest.mark.parametrize("window", [None, 9])
def test_equals_reference_additive_mask(window: int | None) -> None:
    additive = torch.randn(2, 1, 37, 50, generator=torch.Generator().manual_seed(4))
    _compare(((2, 4, 37, 8), (2, 4, 50, 8)), additive, window=window)


@pytest.mark.parametrize("n_kv", [1, 2])
@pytest.mark.parametrize("mask_kind", ["none", "heads", "keys"])
def test_equals_reference_grouped_query(n_kv: int, mask_kind: str) -> None:
    mask = {
        "none": None,
        "heads": torch.rand(2, 4, 37, 50, generator=torch.Generator().manual_seed(5)) > 0.3,
        "keys": torch.arange(50)[None, None, None, :] < torch.tensor([50, 33])[:, None, None, None],
    }[mask_kind]
    _compare(((2, 4, 37, 8), (2, n_kv, 50, 8)), mask, is_causal=True)


@pytest.mark.parametrize(
    ("q_shape", "kv_shape"),
    [((37, 8), (50, 8)), ((3, 37, 8), (3, 50, 8)), ((2, 2, 3, 37, 8), (2, 2, 3, 50, 8))],
)
def test_other_ranks(q_shape: tuple[int, ...], kv_shape: tuple[int, ...]) -> None:
    _compare((q_shape, kv_shape), is_causal=True)
    _compare((q_shape, kv_shape), torch.rand(37, 50) > 0.5)


def test_value_dim_and_fp64_match_math() -> None:
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(2, 37, 8, generator=g).double(), torch.randn(2, 50, 8, generator=g).double()
    v = torch.randn(2, 50, 5, generator=g).double()  # D_v != D
    expected = torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v
    out = flash_attention(q, k, v, scale=0.3, block_q=16, block_k=32)
    assert out.dtype == torch.float64
    # fp64: 2^-52 ~ 2e-16 over 8-term dots and a 50-key softmax ~ 1e-14; 100x room.
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)


# Fully masked rows and windows with no key: tests/nn/test_attention.py (ALL_BACKENDS).


def test_dead_rows_across_tiles_match_reference() -> None:
    # Whole query tiles and whole key tiles masked out, with small tiles.
    mask = torch.ones(1, 1, 50, 50, dtype=torch.bool)
    mask[..., :20, :] = False  # the first query tile and more see nothing
    mask[..., :, 32:] = False  # the second key tile is hidden from everyone
    _compare(((1, 2, 50, 8), (1, 2, 50, 8)), mask, is_causal=True)


def test_dropout_and_weights_are_refused() -> None:
    q = k = v = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="dropout"):
        sdpa(q, k, v, dropout_p=0.1, backend="flash")
    with pytest.raises(ValueError, match="reference"):
        sdpa(q, k, v, return_weights=True, backend="flash")


def test_no_quadratic_tensor_saved_or_allocated() -> None:
    """At n = 2048 nothing of >= n²/4 elements is saved for backward or created at all."""
    from torch.utils._python_dispatch import TorchDispatchMode

    n, limit = 2048, 2048 * 2048 // 4
    largest = {"saved": 0, "created": 0}

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(
            self,
            func: Callable[..., Any],
            types: object,
            args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            for x in out if isinstance(out, tuple | list) else (out,):
                if isinstance(x, torch.Tensor):
                    largest["created"] = max(largest["created"], x.numel())
            return out

    def pack(x: torch.Tensor) -> torch.Tensor:
        largest["saved"] = max(largest["saved"], x.numel())
        return x

    q, k, v = (torch.randn(1, 1, n, 64, requires_grad=True) for _ in range(3))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), Largest():
        out = sdpa(q, k, v, is_causal=True, backend="flash")
        assert isinstance(out, torch.Tensor)
        out.sum().backward()
    assert q.grad is not None and k.grad is not None
    assert 0 < largest["saved"] < limit, largest
    # The largest intermediates are one tile of scores or an O(n·d) copy of q, k, v.
    assert largest["created"] <= max(flash.BLOCK_Q * flash.BLOCK_K, n * 64), largest


def test_model_with_flash_equals_reference() -> None:
    kwargs = {
        "n_layers": 2,
        "d_model": 32,
        "attention.n_heads": 4,
        "ffn.d_ff": 64,
        "vocab_size": 50,
        "max_len": 64,
        "dropout": 0.0,
    }
    torch.manual_seed(0)
    fast = aiayn.build_model("gpt2-small", **kwargs, attention={"backend": "flash"})
    ref = aiayn.build_model("gpt2-small", **kwargs, attention={"backend": "reference"})
    ref.load_state_dict(fast.state_dict())
    ids = torch.randint(1, 50, (2, 40))
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, :9] = False  # left padding
    logits, grads = [], []
    for model in (ref, fast):
        with small_tiles():
            out = model(ids, attention_mask=mask)
        torch.nn.functional.cross_entropy(
            out[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
        ).backward()
        logits.append(out)
        grads.append({name: p.grad for name, p in model.named_parameters()})
    torch.testing.assert_close(logits[1], logits[0], atol=ATOL, rtol=RTOL)
    for name, g_ref in grads[0].items():
        torch.testing.assert_close(grads[1][name], g_ref, atol=ATOL, rtol=RTOL, msg=name)
