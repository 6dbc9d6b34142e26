"""What every model family shares: its config, initialisation, parameter count, positions.

Shapes: B batch, T positions, C = d_model, V vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.nn.blocks import Block, Weights
from aiayn.nn.cache import LayerCache
from aiayn.nn.loss import linear_cross_entropy
from aiayn.nn.multihead import Rotary
from aiayn.nn.norms import build_norm
from aiayn.nn.positions import LearnedPositions, RotaryEmbedding


class Stack(nn.Module):
    """N blocks, and the final norm that pre-LN needs (post-LN blocks end normalised)."""

    def __init__(self, config: ModelConfig, n_layers: int, *, cross: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(config, cross=cross) for _ in range(n_layers))
        self.norm = (
            build_norm(config.norm, config.d_model, config.norm_eps, config.bias)
            if config.norm_position == "pre"
            else None
        )

    def forward(
        self,
        x: Tensor,
        *,
        caches: list[LayerCache] | None = None,
        weights: Weights | None = None,
        **kwargs: object,
    ) -> Tensor:
        for i, block in enumerate(self.blocks):
            cache = None if caches is None else caches[i]
            x = block(x, cache=cache, weights=weights, **kwargs)  # (B, T, C)
        return x if self.norm is None else self.norm(x)


class TransformerModel(nn.Module):
    """Base class: holds the config, initialises weights, counts parameters."""

    config: ModelConfig

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.rotary = (
            RotaryEmbedding(config.head_dim, config.max_len, config.rope_base, config.rope_scaling)
            if config.positional == "rope"
            else None
        )

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """Trainable parameters, each shared (tied) tensor counted once.

        ``exclude_embeddings`` leaves out token and learned position tables (Kaplan et al.'s
        "non-embedding" count, the one that scaling laws use); a tied output projection is
        then left out too, as it is the same tensor.
        """
        skip: set[int] = set()
        if exclude_embeddings:
            for module in self.modules():
                if isinstance(module, nn.Embedding | LearnedPositions):
                    skip.add(id(module.weight))
        return sum(p.numel() for p in self.parameters() if id(p) not in skip)

    def init_weights(self) -> None:
        """N(0, init_std) for matrices, zero biases, unit norms; embeddings that are scaled by
        sqrt(d_model) start at std d_model^-0.5 so that the scaled vectors have unit size; the
        residual output projections are shrunk by 1/sqrt(2N) (GPT-2) so the residual stream's
        variance does not grow with depth."""
        c = self.config
        depth = c.n_layers + (c.decoder_layers if c.arch == "encoder-decoder" else 0)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = c.init_std
                if name.endswith(("self_attn.out", "cross_attn.out", "ffn.w2")):
                    std = c.init_std / math.sqrt(2 * depth)
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                std = c.d_model**-0.5 if c.scale_embeddings else c.init_std
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, LearnedPositions):
                nn.init.normal_(module.weight, 0.0, c.init_std)

    def output_loss(
        self, x: Tensor, targets: Tensor, *, label_smoothing: float = 0.0, ignore_index: int = -100
    ) -> Tensor:
        """Mean cross entropy of the output projection of ``x`` (B, T, C) against ``targets``
        (B, T), computed in chunks without materialising the (B, T, V) logits
        (aiayn/nn/loss.py).  Rows whose target is ``ignore_index`` are skipped."""
        head = self.head
        assert isinstance(head, nn.Linear)
        return linear_cross_entropy(
            x,
            head.weight,
            targets,
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
        )

    def _positions(self, t: int, offset: int, device: torch.device) -> Tensor:
        """(T,) positions offset..offset+T-1, checked against max_len."""
        if offset + t > self.config.max_len:
            raise ValueError(
                f"sequence of length {offset + t} exceeds the model's max_len={self.config.max_len}"
            )
        return torch.arange(offset, offset + t, device=device)

    def _rotary(self, positions: Tensor) -> Rotary | None:
        return None if self.rotary is None else self.rotary(positions)
