"""The paper's model (Figure 1): an encoder over the source and a decoder over the target
that attends to the encoder output through cross-attention (§3.1, §3.2.3).

* The encoder's self-attention sees every source position except padding.
* The decoder's self-attention is causal (§3.2.3): position i sees targets <= i.
* Cross-attention: decoder queries, encoder keys and values ("memory"), source padding hidden.

With a shared source/target vocabulary and ``tie_embeddings``, one matrix serves as source
embedding, target embedding and pre-softmax projection (§3.4).

Shapes: B batch, S source length, T target length, C = d_model, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.models.base import Stack, TransformerModel
from aiayn.nn.blocks import Weights
from aiayn.nn.cache import Cache
from aiayn.nn.embedding import Embeddings, check_ids, check_token_mask
from aiayn.nn.linear import Linear
from aiayn.nn.masks import key_padding_to_attention
from aiayn.nn.moe import RouterStats


class EncoderDecoder(TransformerModel):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.arch != "encoder-decoder":
            raise ValueError(f"EncoderDecoder needs arch='encoder-decoder', got {config.arch!r}")
        c = config

        def embeddings(vocab: int, token: nn.Embedding | None = None) -> Embeddings:
            return Embeddings(
                vocab,
                c.d_model,
                positional=c.positional,
                max_len=c.max_len,
                scale=c.scale_embeddings,
                dropout=c.dropout,
                token=token,
            )

        self.src_embed = embeddings(c.source_vocab_size)
        self.tgt_embed = embeddings(c.vocab_size)
        self.encoder = Stack(c, c.n_layers)
        self.decoder = Stack(c, c.decoder_layers, cross=True)
        self.head = Linear(c.d_model, c.vocab_size, bias=False)
        self.init_weights()
        if c.tie_embeddings:  # three-way tying, §3.4
            self.tgt_embed.token = self.src_embed.token
            self.head.weight = self.src_embed.token.weight

    # ----- masks ----------------------------------------------------------------------------
    def source_mask(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor | None:
        """(B, S) True at real source tokens: ``src_mask`` if given, else ``src != pad_id``."""
        if src_mask is not None:
            check_token_mask(src_mask, src, "src_mask")
            return src_mask
        if self.config.pad_id is None:
            return None
        keep = src != self.config.pad_id
        return None if bool(keep.all()) else keep

    # ----- the two halves -------------------------------------------------------------------
    def encode(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        *,
        weights: Weights | None = None,
        aux: list[RouterStats] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """(B, S) source ids -> (B, S, C) memory and the (B, S) source key mask (or None)."""
        check_ids(src, self.config.source_vocab_size, "src")
        keep = self.source_mask(src, src_mask)
        positions = self._positions(src.shape[1], 0, src.device)
        x = self.src_embed(src, positions)  # (B, S, C)
        mask = None if keep is None else key_padding_to_attention(keep)  # (B, 1, 1, S)
        memory = self.encoder(
            x, mask=mask, rotary=self._rotary(positions), weights=weights, aux=aux
        )
        return memory, keep

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_keep: Tensor | None = None,
        *,
        cache: Cache | None = None,
        weights: Weights | None = None,
        aux: list[RouterStats] | None = None,
        features_only: bool = False,
    ) -> Tensor:
        """(B, T) target ids (shifted right) -> (B, T, V) logits, or the (B, T, C) vectors
        before the output projection with ``features_only``.

        With ``cache``, ``tgt`` holds only the new positions; ``memory`` may be None after the
        first step (cross-attention keys/values are cached).
        """
        check_ids(tgt, self.config.vocab_size, "tgt")
        offset = 0 if cache is None else cache.length
        positions = self._positions(tgt.shape[1], offset, tgt.device)  # (T,)
        x = self.tgt_embed(tgt, positions)  # (B, T, C)
        if cache is not None:
            if src_keep is not None:
                cache.memory_mask = src_keep
            src_keep = cache.memory_mask
        memory_mask = None if src_keep is None else key_padding_to_attention(src_keep)
        x = self.decoder(
            x,
            is_causal=True,
            window=self.config.sliding_window,
            rotary=self._rotary(positions),
            memory=memory,
            memory_mask=memory_mask,
            caches=None if cache is None else cache.layers,
            weights=weights,
            aux=aux,
        )
        return x if features_only else self.head(x)  # (B, T, C) or (B, T, V)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None = None,
        aux: list[RouterStats] | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> Tensor:
        """(B, S) source and (B, T) shifted target ids -> (B, T, V) logits.

        With ``targets`` (B, T), the mean (label-smoothed, §5.4) cross entropy over the target
        tokens that are not padding instead -- computed without the (B, T, V) logits.
        """
        memory, keep = self.encode(src, src_mask, aux=aux)
        if targets is None:
            return self.decode(tgt, memory, keep, aux=aux)
        x = self.decode(tgt, memory, keep, aux=aux, features_only=True)  # (B, T, C)
        return self.output_loss(
            x,
            targets,
            label_smoothing=label_smoothing,
            ignore_index=-100 if self.config.pad_id is None else self.config.pad_id,
        )

    def forward_with_weights(
        self, src: Tensor, tgt: Tensor, *, src_mask: Tensor | None = None
    ) -> tuple[Tensor, dict[str, list[Tensor]]]:
        """Logits and attention weights: encoder self (B, H, S, S), decoder self (B, H, T, T)
        and cross (B, H, T, S), one tensor per layer each (reference backend)."""
        enc: Weights = []
        dec: Weights = []
        memory, keep = self.encode(src, src_mask, weights=enc)
        logits = self.decode(tgt, memory, keep, weights=dec)
        dec_w = [w for w in dec if w is not None]
        return logits, {
            "encoder": [w for w in enc if w is not None],
            "decoder": dec_w[0::2],
            "cross": dec_w[1::2],
        }

    def new_cache(
        self, batch: int, capacity: int | None = None, *, dtype: torch.dtype | None = None
    ) -> Cache:
        """An empty decoder cache for ``batch`` target sequences of up to ``capacity`` tokens."""
        c = self.config
        capacity = c.max_len if capacity is None else capacity
        if capacity > c.max_len:
            raise ValueError(f"cache capacity {capacity} exceeds the model's max_len={c.max_len}")
        p = self.head.weight
        return Cache.empty(
            c.decoder_layers,
            batch,
            c.kv_heads,
            capacity,
            c.head_dim,
            window=c.sliding_window,
            dtype=dtype or p.dtype,
            device=p.device,
        )
