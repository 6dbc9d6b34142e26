"""What every model family shares: its config, initialisation, parameter count, positions.

Shapes: B batch, T positions, C = d_model, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.nn.blocks import Block
from aiayn.nn.cache import Cache
from aiayn.nn.context import Context, Record
from aiayn.nn.embedding import Embeddings
from aiayn.nn.loss import linear_cross_entropy
from aiayn.nn.masks import key_padding_to_attention
from aiayn.nn.norms import build_norm
from aiayn.nn.positions import LearnedPositions
from aiayn.nn.static_cache import StaticCache
from aiayn.nn.static_cache import supports as static_supports


class Stack(nn.Module):
    """N blocks, and the final norm that pre-LN needs (post-LN blocks end normalised)."""

    def __init__(
        self, config: ModelConfig, n_layers: int, *, cross: bool = False, stream: str = "self"
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(config, cross=cross, stream=stream, layer=i) for i in range(n_layers)
        )
        self.norm = (
            build_norm(config.norm, config.d_model, config.norm_eps, config.bias)
            if config.norm_position == "pre"
            else None
        )

    def forward(self, x: Tensor, ctx: Context) -> Tensor:
        for block in self.blocks:
            x = block(x, ctx)  # (B, T, C)
        return x if self.norm is None else self.norm(x)


def head_cross_entropy(
    head: nn.Module, x: Tensor, targets: Tensor, label_smoothing: float, ignore_index: int = -100
) -> Tensor:
    """Mean cross entropy of ``head``'s own logits of ``x`` (B, T, C): for an output projection
    that is not a plain linear layer (int8 weights), whose product runs its own kernel."""
    logits = head(x).float()  # (B, T, V)
    return F.cross_entropy(
        logits.flatten(0, -2),
        targets.flatten(),
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
    )


def _attention_mask(key_mask: Tensor | None) -> Tensor | None:
    """A cache's (B, S) key mask, or a static cache's (B, T, S) one, as (B, 1, 1|T, S)."""
    if key_mask is None:
        return None
    return key_mask[:, None] if key_mask.dim() == 3 else key_padding_to_attention(key_mask)


class TransformerModel(nn.Module):
    """Base class: holds the config, initialises weights, counts parameters, and turns ids into
    a stack's input and forward context."""

    config: ModelConfig
    cache_layers: int = 0  # layers a KV cache needs (decoder self-attention layers)
    # The dtype new KV caches keep keys and values in; None: the model's own
    # (aiayn/models/precision.py sets it for decoding).
    cache_dtype: torch.dtype | None = None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config

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
        """Zero biases and unit norms; matrices as ``config.init`` says: Glorot-uniform
        ("xavier"), or N(0, init_std) with the residual output projections shrunk by
        1/sqrt(2N) ("scaled-normal", GPT-2) so that a pre-LN residual stream's variance does
        not grow with depth.  Embeddings that are scaled by sqrt(d_model) start at std
        d_model^-0.5, so that the scaled vectors have unit size."""
        c = self.config
        depth = c.n_layers + (c.decoder_layers if c.arch == "encoder-decoder" else 0)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                if c.init == "xavier":
                    nn.init.xavier_uniform_(module.weight)
                else:
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
        for module in self.modules():  # layers with an initialisation of their own (Mamba)
            post_init = getattr(module, "post_init", None)
            if callable(post_init):
                post_init()

    def output_loss(
        self, x: Tensor, targets: Tensor, *, label_smoothing: float = 0.0, ignore_index: int = -100
    ) -> Tensor:
        """Mean cross entropy of the output projection of ``x`` (B, T, C) against ``targets``
        (B, T), computed in chunks without materialising the (B, T, V) logits
        (aiayn/nn/loss.py).  Rows whose target is ``ignore_index`` are skipped."""
        head = self.head
        assert isinstance(head, nn.Module)
        if not isinstance(head, nn.Linear):  # int8 weights (aiayn/nn/quantized.py): evaluation
            return head_cross_entropy(head, x, targets, label_smoothing, ignore_index)
        return linear_cross_entropy(
            x,
            head.weight,
            targets,
            bias=head.bias,
            ignore_index=ignore_index,
            label_smoothing=label_smoothing,
        )

    def embed_context(
        self,
        embed: Embeddings,
        ids: Tensor,
        keep: Tensor | None,
        cache: Cache | StaticCache | None,
        *,
        causal: bool,
        record: Record | None,
        token_types: Tensor | None = None,
    ) -> tuple[Tensor, Context]:
        """The (B, T, C) input of a stack and its context, from (B, T) ids (and BERT's (B, T)
        token types).

        ``keep`` (B, T) flags real tokens (None: all real).  Positions count real tokens only,
        so a left-padded prompt sees the positions it would see alone; with a ``cache`` the new
        tokens continue where the cached ones stopped.  Padded keys are hidden from every query.
        """
        t = ids.shape[1]
        if cache is None and t > self.config.max_len:
            raise UserError(
                f"sequence of length {t} exceeds the model's max_len={self.config.max_len}"
            )
        if cache is not None:
            cache.check_room(t, self.config.max_len)
            key_mask, positions, key_positions = cache.advance(t, keep, ids.device)
        elif keep is not None:
            key_mask = keep
            positions = (keep.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
            key_positions = positions
        else:
            key_mask = None
            positions = key_positions = torch.arange(t, device=ids.device)  # (T,)
        x = embed(ids, positions, token_types)  # (B, T, C)
        ctx = Context(
            mask=_attention_mask(key_mask),  # (B, 1, 1|T, S)
            causal=causal,
            window=self.config.attention.sliding_window if causal else None,
            positions=embed.positions.state(positions, key_positions),
            cache=cache,
            record=record,
        )
        return x, ctx

    def new_cache(
        self, batch: int, capacity: int | None = None, *, dtype: torch.dtype | None = None
    ) -> Cache:
        """An empty KV cache for ``batch`` sequences of up to ``capacity`` (max_len) tokens."""
        c = self.config
        if not self.cache_layers:
            raise UserError(f"a {type(self).__name__} does not decode: it has no KV cache")
        capacity = c.max_len if capacity is None else capacity
        if capacity > c.max_len:
            raise UserError(f"cache capacity {capacity} exceeds the model's max_len={c.max_len}")
        p = next(self.parameters())
        return Cache.empty(
            self.cache_layers,
            batch,
            c.kv_heads,
            capacity,
            c.head_dim,
            window=c.attention.sliding_window,
            dtype=dtype or self.cache_dtype or p.dtype,
            device=p.device,
            recurrent=[i for i in range(self.cache_layers) if c.mixer_at(i) != "attention"],
        )

    def new_static_cache(
        self, batch: int, capacity: int | None = None, *, dtype: torch.dtype | None = None
    ) -> StaticCache:
        """An empty static KV cache (aiayn/nn/static_cache.py): what a captured decoding step
        needs.  Refused, with the reason, for a model whose layers keep other state."""
        c = self.config
        why = static_supports(self)
        if why is not None:
            raise UserError(f"this model cannot use a static KV cache: {why}")
        capacity = c.max_len if capacity is None else capacity
        if capacity > c.max_len:
            raise UserError(f"cache capacity {capacity} exceeds the model's max_len={c.max_len}")
        p = next(self.parameters())
        return StaticCache(
            self.cache_layers,
            batch,
            c.kv_heads,
            capacity,
            c.head_dim,
            dtype=dtype or self.cache_dtype or p.dtype,
            device=p.device,
        )
