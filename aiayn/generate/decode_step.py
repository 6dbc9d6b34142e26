"""One decoding step of a decoder-only model, written flat for speed on CPU.

A cached decoding step runs every layer on one new token per sequence.  Its arithmetic is
small -- each weight matrix is used once, in a matrix-vector product -- so the time goes to
two things:

1. **Reading the weights.**  Every step streams all of them from memory; a batch-1 step can go
   no faster than ``weight bytes / memory bandwidth``.  For one row, BLAS's ``sgemv`` (numpy's
   matmul, on a zero-copy view of the weight) reads at ~45 GB/s here, against ~37 GB/s for
   oneDNN with a packed weight and ~18 GB/s for ``F.linear`` (MKL); for several rows oneDNN's
   packed product is the fastest, so that is used there (``benchmarks/lm.py`` measures both).
2. **Per-operation overhead.**  The module path (``nn.Module`` calls, argument checks, views)
   costs about 0.2 ms per layer -- as much as the arithmetic of a 6-layer, 384-wide model.

:class:`FlatDecoder` does exactly what ``DecoderLM.forward(ids, cache=cache)`` does for one
token per row -- same parameters (no copies), same :class:`~aiayn.nn.cache.Cache`, same left
padding and positions -- with each layer's tensors gathered once into a tuple and the step a
straight loop over them.  Prefill, beam reordering and anything else keep using the model;
steps here and there can be mixed freely.  tests/generate/test_decode_step.py checks that the
logits equal the module path's for GPT-2- and Llama-style models, with left padding, rotary
positions, grouped-query attention and post-LN.

Shapes: B rows, C = d_model, H / H_kv heads, D head size, S cached positions, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.models.decoder import DecoderLM
from aiayn.nn.blocks import Block
from aiayn.nn.cache import Cache
from aiayn.nn.feedforward import FeedForward, GatedFeedForward
from aiayn.nn.linear import Linear, _onednn
from aiayn.nn.positions import apply_rotary

MatVec = Callable[[Tensor], Tensor]  # (B, I) -> (B, O)


def _norm(module: nn.Module) -> Callable[[Tensor], Tensor]:
    if isinstance(module, nn.LayerNorm):
        shape, w, b, eps = module.normalized_shape, module.weight, module.bias, module.eps
        return lambda x: F.layer_norm(x, shape, w, b, eps)
    if isinstance(module, nn.RMSNorm):
        rms_shape, g, rms_eps = module.normalized_shape, module.weight, module.eps
        return lambda x: F.rms_norm(x, rms_shape, g, rms_eps)
    raise ValueError(f"unsupported norm {type(module).__name__}")


def _matvec(linear: nn.Linear, rows: int) -> MatVec:
    """``x W^T + b`` for (rows, I) inputs, by the fastest route for that many rows."""
    w, b = linear.weight.detach(), None if linear.bias is None else linear.bias.detach()
    cpu_fp32 = w.device.type == "cpu" and w.dtype == torch.float32
    if cpu_fp32 and rows == 1:
        wt = w.numpy().T  # (I, O) view of the weight: no copy
        if b is None:
            return lambda x: torch.from_numpy(np.matmul(x.numpy(), wt))

        bn = b.numpy()

        def gemv_bias(x: Tensor) -> Tensor:
            out = np.matmul(x.numpy(), wt)
            np.add(out, bn, out=out)
            return torch.from_numpy(out)

        return gemv_bias
    packed = getattr(linear, "packed", None)
    if cpu_fp32 and isinstance(linear, Linear) and packed is not None:
        return lambda x: _onednn(x, packed, b)
    return lambda x: F.linear(x, w, b)


def _swiglu(h: Tensor, half: int) -> Tensor:
    gate, up = h.split(half, dim=-1)  # (B, F) each
    return F.silu(gate) * up


@dataclass
class _Layer:
    norm1: Callable[[Tensor], Tensor]
    qkv: MatVec
    out: MatVec
    norm2: Callable[[Tensor], Tensor]
    w1: MatVec  # W1 (or the fused [W1; W3] of SwiGLU)
    w2: MatVec
    act: Callable[[Tensor], Tensor]


class FlatDecoder:
    """The decoding step of ``model`` for ``rows`` sequences at a time.

    Build it once per generation (inside :func:`~aiayn.nn.linear.packed_for_inference` when
    ``rows`` > 1, so the packed weights are picked up) and call :meth:`step`.
    """

    def __init__(self, model: DecoderLM, rows: int) -> None:
        reason = self.unsupported(model)
        if reason:
            raise ValueError(f"FlatDecoder cannot run this model: {reason}")
        c = model.config
        self.model, self.rows = model, rows
        self.pre_norm = c.norm_position == "pre"
        self.h, self.h_kv, self.d = c.n_heads, c.kv_heads, c.head_dim
        self.split = (self.h * self.d, self.h_kv * self.d, self.h_kv * self.d)
        self.layers: list[_Layer] = []
        for block in model.decoder.blocks:
            assert isinstance(block, Block)
            ffn = block.ffn
            act: Callable[[Tensor], Tensor]
            if isinstance(ffn, GatedFeedForward):
                w1, act = ffn.w13, partial(_swiglu, half=ffn.d_ff)
            else:
                assert isinstance(ffn, FeedForward)
                w1, act = ffn.w1, ffn.act
            self.layers.append(
                _Layer(
                    _norm(block.norm1),
                    _matvec(block.self_attn.qkv, rows),
                    _matvec(block.self_attn.out, rows),
                    _norm(block.norm2),
                    _matvec(w1, rows),
                    _matvec(ffn.w2, rows),
                    act,
                )
            )
        norm = model.decoder.norm
        self.final_norm = None if norm is None else _norm(norm)
        self.head = _matvec(model.head, rows)
        self.gqa = self.h != self.h_kv

    @staticmethod
    def unsupported(model: nn.Module) -> str | None:
        """Why the flat step cannot run ``model`` (None if it can)."""
        if not isinstance(model, DecoderLM):
            return f"{type(model).__name__} is not a DecoderLM"
        c = model.config
        if c.n_experts:
            return "mixture-of-experts layers"
        if c.sliding_window is not None:
            return "a sliding window (rolling cache)"
        if model.training:
            return "the model is in training mode"
        return None

    @torch.no_grad()
    def step(self, ids: Tensor, cache: Cache) -> Tensor:
        """(B, 1) new token ids -> (B, V) next-token logits; appends to ``cache``."""
        if self.rows != 1:
            return self._step(ids, cache)
        # One row: the products run in BLAS's own threads; torch's small element-wise ops run
        # on this thread, so that two thread pools never spin against each other.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._step(ids, cache)
        finally:
            torch.set_num_threads(threads)

    def _step(self, ids: Tensor, cache: Cache) -> Tensor:
        b = ids.shape[0]
        if ids.shape != (self.rows, 1):
            raise ValueError(f"step takes ({self.rows}, 1) ids, got {tuple(ids.shape)}")
        model = self.model
        mask = None
        if cache.key_mask is not None:  # left padding in the batch: per-row positions
            keys, positions = cache.append_key_mask(torch.ones_like(ids, dtype=torch.bool))
            mask = keys[:, None, None, :]  # (B, 1, 1, S)
        else:
            positions = model._positions(1, cache.length, ids.device)  # (1,)
        x = model.embed(ids, positions).view(b, -1)  # (B, C)
        rotary = model._rotary(positions)
        h, h_kv, d = self.h, self.h_kv, self.d
        for layer, lc in zip(self.layers, cache.layers, strict=True):
            a_in = layer.norm1(x) if self.pre_norm else x
            q, k, v = layer.qkv(a_in).split(self.split, dim=-1)  # (B, H*D), (B, H_kv*D) x 2
            q, k, v = q.view(b, h, 1, d), k.view(b, h_kv, 1, d), v.view(b, h_kv, 1, d)
            if rotary is not None:
                cos, sin = rotary
                q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            keys, values = lc.self_kv.update(k, v)  # (B, H_kv, S, D)
            att = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, enable_gqa=self.gqa
            )  # (B, H, 1, D)
            o = layer.out(att.reshape(b, h * d))
            x = x + o if self.pre_norm else layer.norm1(x + o)
            f_in = layer.norm2(x) if self.pre_norm else x
            f = layer.w2(layer.act(layer.w1(f_in)))
            x = x + f if self.pre_norm else layer.norm2(x + f)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.head(x)  # (B, V)
