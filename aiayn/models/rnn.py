"""The recurrent encoder-decoders the Transformer replaced, as baselines in the same package.

* Without attention (Sutskever et al., 2014; Cho et al., 2014): the decoder sees the source
  only through its initial state, made from the encoder's last states -- the fixed-size
  "bottleneck" that long sentences overflow.
* With additive attention (Bahdanau et al., 2015): at every target step the decoder scores
  every encoder state with ``w^T tanh(W s + U h)``, and mixes them into a context vector, so
  that no single state has to carry the whole source.

Both read the source with the same bidirectional GRU or LSTM (``config.rnn.cell``; ``n_layers``
layers, ``d_model / 2`` units per direction, run over packed sequences so that padding never
enters a state).  The decoder's initial state is ``tanh(W_b [→h_last; ←h_first])`` of the top
encoder layer, in every decoder layer (Bahdanau's s_0; an LSTM's cells start at zero).

The decoder is a unidirectional ``n_layers`` RNN of ``d_model`` units over the target
embeddings.  With attention it follows Luong et al. (2015): the attention reads the RNN's new
state s_t (rather than s_{t-1}, as Bahdanau's does) with Bahdanau's additive score, and the
output is ``tanh(W_c [s_t; c_t])``.  That order lets training run the decoder RNN over the
whole target in one call, the speed a fair baseline deserves; the information flow is the
same.  Without attention the output is ``s_t`` itself.  The output projection is tied to the
embeddings as in the Transformer (``tie_embeddings``).

These models subclass ``EncoderDecoder`` for its interface
-- ``encode``, ``decode`` with a cache, ``forward`` with targets -- so that one trainer, one
beam search, one BLEU scorer and one checkpoint format serve both; the Transformer's stacks
are not built.

Shapes: B batch, S source length, T target length, C = d_model, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from aiayn.config import ModelConfig
from aiayn.errors import UserError
from aiayn.models.base import TransformerModel
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.nn.attention import masked_softmax
from aiayn.nn.context import AttentionRecord, Record
from aiayn.nn.embedding import check_ids
from aiayn.nn.linear import Linear
from aiayn.nn.multihead import memory_groups

State = Tensor | tuple[Tensor, Tensor]  # GRU: h; LSTM: (h, c) -- each (L, B, C)


class RNNCache:
    """What a decoding step carries: the decoder state, the encoder states and their
    attention keys, the source mask.  Reordered with the beams like a KV cache."""

    def __init__(self) -> None:
        self.state: State | None = None
        self.memory: Tensor | None = None  # (B, S, C)
        self.keys: Tensor | None = None  # (B, S, C) U h, computed once
        self.memory_mask: Tensor | None = None  # (B, S) True at real source tokens
        self.length = 0

    def reorder(self, index: Tensor, memory_index: Tensor | None = None) -> None:
        """Keep rows ``index`` (B',): beam search's surviving parents.  The encoder states are
        kept per row here, so they follow ``index`` (``memory_index`` is not needed)."""
        if isinstance(self.state, tuple):
            self.state = (self.state[0][:, index], self.state[1][:, index])
        elif self.state is not None:
            self.state = self.state[:, index]
        for name in ("memory", "keys", "memory_mask"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[index])


def _per_row(memory: Tensor, keep: Tensor | None, rows: int) -> tuple[Tensor, Tensor | None]:
    """(B, S, C) encoder states shared by groups of ``rows`` / B decoder rows -> one per row
    (each row has its own recurrent state, so the states are kept per row)."""
    groups = memory_groups(rows, memory.shape[0], "the encoder output", "decoder")
    memory = memory.repeat_interleave(groups, 0)
    return memory, None if keep is None else keep.repeat_interleave(groups, 0)


class AdditiveAttention(nn.Module):
    """Bahdanau's score ``w^T tanh(W s + U h)`` over the encoder states, softmax, context."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.query = Linear(d_model, d_model, bias=False)  # W
        self.key = Linear(d_model, d_model, bias=True)  # U (its bias is the hidden layer's)
        self.w = Linear(d_model, 1, bias=False)

    def forward(
        self, s: Tensor, memory: Tensor, keys: Tensor, keep: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(B, T, C) decoder states -> (B, T, C) contexts, (B, T, S) weights and the (B, T, S)
        scores before the mask.  A source with no real token gets zero weights, not NaN."""
        hidden = torch.tanh(self.query(s).unsqueeze(2) + keys.unsqueeze(1))  # (B, T, S, C)
        scores = self.w(hidden).squeeze(-1)  # (B, T, S)
        mask = None if keep is None else keep[:, None, :]
        weights = masked_softmax(scores, mask, is_causal=False, window=None)
        return weights @ memory, weights, scores  # (B, T, C), (B, T, S), (B, T, S)


class RNNEncoderDecoder(EncoderDecoder):
    """A GRU or LSTM encoder-decoder, with or without additive attention (module docstring)."""

    def __init__(self, config: ModelConfig) -> None:
        TransformerModel.__init__(self, config)  # not EncoderDecoder's: no Transformer stacks
        c = config
        if c.rnn.cell is None:
            raise UserError("RNNEncoderDecoder needs config.rnn.cell = 'gru' or 'lstm'")
        if c.d_model % 2:
            raise UserError(f"d_model={c.d_model} must be even: half per encoder direction")
        cell = nn.GRU if c.rnn.cell == "gru" else nn.LSTM
        inner = c.dropout if c.n_layers > 1 else 0.0
        self.src_token = nn.Embedding(c.source_vocab_size, c.d_model, padding_idx=c.pad_id)
        self.tgt_token = nn.Embedding(c.vocab_size, c.d_model, padding_idx=c.pad_id)
        self.encoder_rnn = cell(
            c.d_model,
            c.d_model // 2,
            c.n_layers,
            batch_first=True,
            bidirectional=True,
            dropout=inner,
        )
        self.decoder_rnn = cell(
            c.d_model,
            c.d_model,
            c.decoder_layers,
            batch_first=True,
            dropout=inner if c.decoder_layers > 1 else 0.0,
        )
        self.bridge = Linear(c.d_model, c.d_model)  # W_b: encoder summary -> s_0
        self.attention = AdditiveAttention(c.d_model) if c.rnn.attention else None
        self.combine = Linear(2 * c.d_model, c.d_model) if c.rnn.attention else None  # W_c
        self.head = Linear(c.d_model, c.vocab_size, bias=False)
        self.init_weights()
        if c.tie_embeddings:
            self.tgt_token = self.src_token
            self.head.weight = self.src_token.weight

    # ----- the two halves -------------------------------------------------------------------
    def encode(
        self, src: Tensor, src_mask: Tensor | None = None, *, record: Record | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """(B, S) source ids -> (B, S, C) encoder states (zero at padding) and the (B, S)
        source mask (or None)."""
        check_ids(src, self.config.source_vocab_size, "src")
        keep = self.source_mask(src, src_mask)
        x = F.dropout(self.src_token(src), self.config.dropout, self.training)  # (B, S, C)
        if keep is None:
            memory, _ = self.encoder_rnn(x)
        else:
            lengths = keep.sum(-1).clamp(min=1)
            if not bool(
                (keep == (torch.arange(keep.shape[1], device=keep.device) < lengths[:, None])).all()
            ):
                raise UserError(
                    "an RNN encoder reads right-padded sources: every source mask must be a"
                    " run of real tokens followed by padding"
                )
            lengths = lengths.cpu()
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.encoder_rnn(packed)
            memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.shape[1])
        return F.dropout(memory, self.config.dropout, self.training), keep

    def initial_state(self, memory: Tensor, keep: Tensor | None) -> State:
        """s_0 = tanh(W_b [→h_last; ←h_first]) in every decoder layer: (L, B, C)."""
        b, s, c = memory.shape
        half = c // 2
        last = keep.sum(-1).clamp(min=1) - 1 if keep is not None else torch.full((b,), s - 1)
        rows = torch.arange(b, device=memory.device)
        summary = torch.cat(
            [memory[rows, last.to(memory.device), :half], memory[:, 0, half:]], dim=-1
        )  # (B, C)
        h = torch.tanh(self.bridge(summary)).unsqueeze(0).repeat(self.config.decoder_layers, 1, 1)
        return (h, torch.zeros_like(h)) if self.config.rnn.cell == "lstm" else h

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor | None,
        src_keep: Tensor | None = None,
        *,
        cache: RNNCache | None = None,  # type: ignore[override]
        record: Record | None = None,
        features_only: bool = False,
    ) -> Tensor:
        """(B, T) target ids (shifted right) -> (B, T, V) logits, or the (B, T, C) vectors
        before the output projection.  With ``cache``, ``tgt`` holds only the new positions
        and ``memory`` is needed on the first call only."""
        check_ids(tgt, self.config.vocab_size, "tgt")
        if cache is not None:
            if cache.state is None:  # the first step: the encoder output starts the decoder
                if memory is None:
                    raise UserError("the first decoding step needs the encoder output (memory)")
                if memory.shape[0] != tgt.shape[0]:  # one sentence for a group of beams
                    memory, src_keep = _per_row(memory, src_keep, tgt.shape[0])
                cache.memory, cache.memory_mask = memory, src_keep
                cache.keys = None if self.attention is None else self.attention.key(memory)
                cache.state = self.initial_state(memory, src_keep)
            memory, src_keep = cache.memory, cache.memory_mask
            state, keys = cache.state, cache.keys
        else:
            if memory is None:
                raise UserError("decode needs the encoder output (memory) without a cache")
            state = self.initial_state(memory, src_keep)
            keys = None if self.attention is None else self.attention.key(memory)
        assert memory is not None
        x = F.dropout(self.tgt_token(tgt), self.config.dropout, self.training)  # (B, T, C)
        out, state = self.decoder_rnn(x, state)  # (B, T, C)
        if cache is not None:
            cache.state, cache.length = state, cache.length + tgt.shape[1]
        if self.attention is not None:
            assert keys is not None and self.combine is not None
            context, weights, scores = self.attention(out, memory, keys, src_keep)
            if record is not None and record.wants_attention:  # as one "head": (B, 1, T, S)
                w = weights.unsqueeze(1).detach() if record.weights else None
                e = scores.unsqueeze(1).detach().float() if record.scores else None
                record.attention.append(AttentionRecord("cross", 0, w, e, False, None))
            out = torch.tanh(self.combine(torch.cat([out, context], dim=-1)))
        out = F.dropout(out, self.config.dropout, self.training)
        return out if features_only else self.head(out)  # (B, T, C) or (B, T, V)

    def new_cache(  # type: ignore[override]
        self, batch: int, capacity: int | None = None, *, dtype: torch.dtype | None = None
    ) -> RNNCache:
        """An empty decoding state (an RNN's does not grow with the output: no capacity)."""
        return RNNCache()
