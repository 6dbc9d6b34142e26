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

from torch import Tensor

from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.models.base import Stack, TransformerModel
from aiayn.nn.cache import Cache
from aiayn.nn.context import Record
from aiayn.nn.embedding import Embeddings, check_ids, check_token_mask
from aiayn.nn.linear import Linear
from aiayn.nn.masks import key_padding_to_attention
from aiayn.nn.static_cache import StaticCache


class EncoderDecoder(TransformerModel):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        if config.arch != "encoder-decoder":
            raise UserError(f"EncoderDecoder needs arch='encoder-decoder', got {config.arch!r}")
        c = config
        self.cache_layers = c.decoder_layers
        self.src_embed = Embeddings(c, c.source_vocab_size)
        self.tgt_embed = Embeddings(c, c.vocab_size)
        self.encoder = Stack(c, c.n_layers, stream="encoder")
        self.decoder = Stack(c, c.decoder_layers, cross=True, stream="decoder")
        self.head = Linear(c.d_model, c.vocab_size, bias=c.head_bias)
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
        self, src: Tensor, src_mask: Tensor | None = None, *, record: Record | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """(B, S) source ids -> (B, S, C) memory and the (B, S) source key mask (or None)."""
        check_ids(src, self.config.source_vocab_size, "src")
        keep = self.source_mask(src, src_mask)
        x, ctx = self.embed_context(self.src_embed, src, keep, None, causal=False, record=record)
        return self.encoder(x, ctx), keep

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_keep: Tensor | None = None,
        *,
        cache: Cache | StaticCache | None = None,
        record: Record | None = None,
        features_only: bool = False,
    ) -> Tensor:
        """(B, T) target ids (shifted right) -> (B, T, V) logits, or the (B, T, C) vectors
        before the output projection with ``features_only``.

        With ``cache``, ``tgt`` holds only the new positions; ``memory`` may be None after the
        first step (cross-attention keys/values are cached).
        """
        check_ids(tgt, self.config.vocab_size, "tgt")
        if cache is not None:
            if src_keep is not None:
                cache.memory_mask = src_keep
            src_keep = cache.memory_mask
        x, ctx = self.embed_context(self.tgt_embed, tgt, None, cache, causal=True, record=record)
        ctx.memory = memory
        ctx.memory_mask = None if src_keep is None else key_padding_to_attention(src_keep)
        x = self.decoder(x, ctx)
        return x if features_only else self.head(x)  # (B, T, C) or (B, T, V)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None = None,
        record: Record | None = None,
        targets: Tensor | None = None,
        label_smoothing: float = 0.0,
    ) -> Tensor:
        """(B, S) source and (B, T) shifted target ids -> (B, T, V) logits.

        With ``targets`` (B, T), the mean (label-smoothed, §5.4) cross entropy over the target
        tokens that are not padding instead -- computed without the (B, T, V) logits.
        """
        memory, keep = self.encode(src, src_mask, record=record)
        if targets is None:
            return self.decode(tgt, memory, keep, record=record)
        x = self.decode(tgt, memory, keep, record=record, features_only=True)  # (B, T, C)
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
        record = Record(weights=True)
        logits = self(src, tgt, src_mask=src_mask, record=record)
        return logits, {
            stream: [a.weights for a in record.stream(stream) if a.weights is not None]
            for stream in ("encoder", "decoder", "cross")
        }
