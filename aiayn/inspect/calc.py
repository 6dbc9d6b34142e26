"""What a model costs, worked out from its config alone: parameters, FLOPs, memory.

Every function here is arithmetic over a ``ModelConfig`` -- no model is
built, so a 70B config answers instantly.  The parameter count mirrors the modules exactly
(tests/inspect/test_calc.py checks it against ``build_model(config).num_parameters()`` for
every preset and a grid of variants), and the KV-cache size is checked against the bytes a real
``Cache`` allocates.

Conventions:

* FLOPs follow PaLM (Chowdhery et al., 2022, appendix B): a multiply-add is 2 FLOPs, the
  backward pass costs twice the forward, so training costs ``6·N_matmul + 12·L·T·d_attn`` per
  token, where N_matmul counts the weights of every matrix multiplication (the output
  projection included even when it is tied to the embedding; embedding lookups, position
  tables, biases and norms left out), L the attention sublayers, T the keys each query sees and
  d_attn = n_heads · d_head.  Causal masking is *not* halved (PaLM does not either).
  Additive scores (``attention_score = "additive"``) cost ``15·L·T·d_attn``: the sum q + k
  adds one FLOP per pair and dimension to the multiply-add (tanh is not counted).
* Bytes use binary units: 1 KiB = 1024 B, 1 GiB = 1024³ B.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.config import ModelConfig
from aiayn.errors import UserError

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "int8": 1,
    "fp8": 1,
}


def dtype_size(dtype: str | int) -> int:
    """Bytes per element of a dtype name (``"bf16"``, ``"float32"``, ...) or a byte count."""
    if isinstance(dtype, bool) or not isinstance(dtype, str | int):
        raise UserError(f"dtype {dtype!r} is invalid: expected a name or a byte count")
    if isinstance(dtype, int):
        if dtype < 1:
            raise UserError(f"dtype_bytes={dtype} is invalid: expected a positive byte count")
        return dtype
    if dtype.lower() not in DTYPE_BYTES:
        raise UserError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype.lower()]


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name}={value!r} is invalid: expected a positive integer")
    return value


# ----- parameters -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ParameterBreakdown:
    """Parameters by kind; each shared (tied) tensor counted once.

    * ``embeddings`` -- token tables, learned position tables and token-type tables.
    * ``attention`` -- every self- and cross-attention sublayer (projections and biases).
    * ``feed_forward`` -- every position-wise feed-forward network (all experts and the
      routers of a mixture of experts).
    * ``norms`` -- the blocks' norms, the final norms of a pre-LN stack, and the norms over
      the embeddings (BERT).
    * ``head`` -- the output projection when untied; for an encoder, the whole masked-LM
      head (dense layer, norm, vocabulary bias and untied projection) and the pooler.
    """

    embeddings: int
    attention: int
    feed_forward: int
    norms: int
    head: int

    @property
    def total(self) -> int:
        return self.embeddings + self.attention + self.feed_forward + self.norms + self.head


def _transformer(c: ModelConfig) -> ModelConfig:
    if c.rnn.cell is not None:
        raise UserError(
            f"rnn.cell={c.rnn.cell!r}: this calculation covers the Transformer; for the"
            " recurrent baselines use build_model(config).num_parameters() and"
            " translation_batch_flops"
        )
    if c.vision.image_size is not None:
        raise UserError(
            f"vision.image_size={c.vision.image_size}: this calculation covers text models;"
            " for the Vision Transformer use build_model(config).num_parameters()"
        )
    return c


def _attention_weights(c: ModelConfig) -> int:
    """Weights of one attention sublayer: fused Q/K/V (or Q and fused K/V) and W^O."""
    q, kv = c.attention.n_heads * c.head_dim, c.kv_heads * c.head_dim
    return c.d_model * (q + 2 * kv) + q * c.d_model


def _attention_score_weights(c: ModelConfig) -> int:
    """The per-head vector w of additive scores w^T tanh(q + k) (aiayn/nn/additive.py): used
    once per query-key pair, so it counts in the attention FLOPs, not in N_matmul."""
    return c.attention.n_heads * c.head_dim if c.attention.score == "additive" else 0


def _attention_biases(c: ModelConfig) -> int:
    q, kv = c.attention.n_heads * c.head_dim, c.kv_heads * c.head_dim
    return (q + 2 * kv if c.projection_bias else 0) + (c.d_model if c.bias else 0)


def _ffn_weights(c: ModelConfig) -> int:
    f = c.ffn
    hidden = 2 * f.d_ff if f.activation == "swiglu" else f.d_ff  # SwiGLU fuses W1 and W3
    return c.d_model * hidden + f.d_ff * c.d_model


def _ffn_biases(c: ModelConfig) -> int:
    f = c.ffn
    hidden = 2 * f.d_ff if f.activation == "swiglu" else f.d_ff
    return (hidden + c.d_model) if c.bias else 0


def _ffn_sublayer(c: ModelConfig) -> int:
    """Parameters of one feed-forward sublayer: one FFN, or E experts and a bias-free router."""
    one = _ffn_weights(c) + _ffn_biases(c)
    return one if c.ffn.n_experts is None else c.ffn.n_experts * (one + c.d_model)


def _ffn_active_weights(c: ModelConfig) -> int:
    """Matmul weights one token passes through in a feed-forward sublayer: the router and its
    top-k experts in a mixture of experts (no token dropped by a capacity factor)."""
    w = _ffn_weights(c)
    return w if c.ffn.n_experts is None else c.ffn.top_k * w + c.d_model * c.ffn.n_experts


def _norm(c: ModelConfig, bias: bool) -> int:
    if c.norm == "rmsnorm":  # a gain only
        return c.d_model
    return c.d_model * (2 if bias else 1)


def _stacks(c: ModelConfig) -> tuple[int, int]:
    """(blocks, cross-attention sublayers) over all stacks."""
    if c.arch == "encoder-decoder":
        return c.n_layers + c.decoder_layers, c.decoder_layers
    return c.n_layers, 0


def _ssm_sizes(c: ModelConfig) -> tuple[int, int, int, int]:
    """(E, H, N, K) of a selective state-space layer (aiayn/nn/ssm.py): inner width, heads,
    state size, convolution taps."""
    e = c.mixer.ssm_expand * c.d_model
    return e, e // c.mixer.ssm_head_dim, c.mixer.ssm_state, c.mixer.ssm_conv


def _ssm_matmul_weights(c: ModelConfig) -> int:
    """in_proj (z, x, B, C and one Δ per head) and out_proj."""
    e, h, n, _ = _ssm_sizes(c)
    return c.d_model * (2 * e + 2 * n + h) + e * c.d_model


def _ssm_parameters(c: ModelConfig) -> int:
    """Every parameter of one state-space layer: the matrices, the depthwise convolution over
    x, B and C (K taps and a bias per channel), Δ's bias, A and D (one per head), the gated
    RMSNorm's weight, and the projections' biases."""
    e, h, n, k = _ssm_sizes(c)
    biases = (2 * e + 2 * n + h + c.d_model) if c.bias else 0
    return _ssm_matmul_weights(c) + (e + 2 * n) * (k + 1) + 3 * h + e + biases


def _ssm_scan_flops(c: ModelConfig, context: int) -> int:
    """Forward FLOPs per token of one layer's chunked scan (aiayn/nn/ssm.py), chunks of
    Q = min(64, context): C·B over the chunk (2 Q N), the masked Q x Q block times x
    (2 Q E), the chunk's state and the read-out of the entering state (2 E N each), and the
    depthwise convolution over x, B and C (2 (E + 2N) K)."""
    e, _, n, k = _ssm_sizes(c)
    q = min(64, context)
    return 2 * q * n + 2 * q * e + 4 * e * n + 2 * (e + 2 * n) * k


def _mixers(c: ModelConfig) -> dict[str, int]:
    """How many self-attention sublayers of each kind: "attention" (softmax or linear, whose
    weights are the same) and "ssm"."""
    blocks, cross = _stacks(c)
    if c.arch != "decoder":
        return {"attention": blocks + cross, "ssm": 0}
    ssm = sum(c.mixer_at(i) == "ssm" for i in range(c.n_layers))
    return {"attention": blocks - ssm, "ssm": ssm}


def _attention_sublayers(c: ModelConfig) -> int:
    blocks, cross = _stacks(c)
    return blocks + cross


def parameter_breakdown(config: ModelConfig) -> ParameterBreakdown:
    """Parameters by kind, computed from the config (see ``ParameterBreakdown``)."""
    c = _transformer(config)
    d, v = c.d_model, c.vocab_size
    blocks, cross = _stacks(c)
    n_stacks = 2 if c.arch == "encoder-decoder" else 1

    if c.arch == "encoder-decoder" and not c.tie_embeddings:
        tokens = (c.source_vocab_size + v) * d
    else:  # one table (three-way tied in an encoder-decoder: §3.4)
        tokens = v * d
    positions = n_stacks * c.max_len * d if c.positions.scheme == "learned" else 0
    tokens += c.type_vocab_size * d  # BERT's token-type (segment) table

    mixers = _mixers(c)
    attention = mixers["attention"] * (
        _attention_weights(c) + _attention_biases(c) + _attention_score_weights(c)
    ) + mixers["ssm"] * _ssm_parameters(c)
    feed_forward = blocks * _ffn_sublayer(c)
    final = n_stacks if c.norm_position == "pre" else 0
    embedding_norms = n_stacks if c.embedding_norm else 0
    norms = (2 * blocks + cross + final + embedding_norms) * _norm(c, c.bias)

    projection = 0 if c.tie_embeddings else v * d
    if c.arch == "encoder":
        # MaskedLMHead: dense (with bias), norm (with bias), projection + its bias; pooler.
        head = (d * d + d + _norm(c, True) + projection + v) if c.mlm_head else 0
        head += d * d + d if c.pooler else 0
    else:
        head = projection + (v if c.head_bias else 0)
    return ParameterBreakdown(
        embeddings=tokens + positions,
        attention=attention,
        feed_forward=feed_forward,
        norms=norms,
        head=head,
    )


def parameter_count(config: ModelConfig) -> int:
    """Trainable parameters, tied tensors counted once: equals
    ``build_model(config).num_parameters()`` without building anything."""
    return parameter_breakdown(config).total


def matmul_parameters(config: ModelConfig) -> int:
    """N_matmul: the weights that take part in a matrix multiplication per token.

    Attention and feed-forward matrices, the output projection to the vocabulary (counted even
    when it is tied: the lookup is free, the projection is not), and an encoder's dense head
    layer.  Embedding lookups, position tables, biases and norms are left out.  With a
    mixture of experts, only the router and the ``experts_top_k`` experts a token visits count
    (the *active* parameters).
    """
    c = _transformer(config)
    blocks, _ = _stacks(c)
    mixers = _mixers(c)
    n = mixers["attention"] * _attention_weights(c) + mixers["ssm"] * _ssm_matmul_weights(c)
    n += blocks * _ffn_active_weights(c)
    if c.arch != "encoder" or c.mlm_head:
        n += c.vocab_size * c.d_model
    if c.arch == "encoder" and c.mlm_head:
        n += c.d_model * c.d_model
    return n


# ----- FLOPs ----------------------------------------------------------------------------------


def softmax_layers(config: ModelConfig) -> int:
    """Layers of the decoding stack that attend with the softmax (and so keep keys and values):
    all of them, except the linear-attention layers of ``mixer = "linear"``."""
    c = config
    layers = c.decoder_layers if c.arch == "encoder-decoder" else c.n_layers
    return sum(c.mixer_at(i) == "attention" for i in range(layers))


def _attention_span_sum(config: ModelConfig, context: int) -> int:
    """Sum over attention sublayers of the keys each query sees.  A linear-attention layer
    sees a state instead: its width d_head + 1 (S and z of aiayn/nn/linear_attention.py) takes
    the place of the context -- per token, φ(k)vᵀ into S and φ(q)ᵀS out, whatever the length."""
    c = config
    self_span = kv_cached_positions(c, context)
    if c.arch == "encoder-decoder":  # encoder self, decoder self (maybe windowed), cross
        return c.n_layers * context + c.decoder_layers * (self_span + context)
    if c.arch == "encoder":
        return c.n_layers * context
    softmax = softmax_layers(c)
    linear = sum(c.mixer_at(i) == "linear" for i in range(c.n_layers))
    return softmax * self_span + linear * (c.head_dim + 1)


def training_flops_per_token(config: ModelConfig, context: int) -> int:
    """Forward + backward FLOPs per token: ``6·N_matmul + 12·L·T·d_attn`` (PaLM, appendix B).

    N_matmul is ``matmul_parameters``; d_attn = n_heads · d_head; the attention term sums
    over the L attention sublayers the keys T each query sees: the context, or the sliding
    window when it is shorter (decoder self-attention).  Causal masking is not discounted.

    Encoder-decoder: a "token" is one target token together with one source token -- the
    source and target are assumed to be of equal length ``context``.  The encoder's and the
    decoder's layers both count, and so does each decoder layer's cross-attention (T queries
    against ``context`` source keys).
    """
    c = config
    d_attn = c.attention.n_heads * c.head_dim
    # Per query-key pair and head dimension, forward: the score (2: multiply-add; additive
    # scores 3: the sum q + k, then the multiply-add with w -- tanh is not counted) and the
    # weighted value (2); backward twice that.
    per_pair = 12 if c.attention.score == "dot" else 15
    attention = per_pair * _attention_span_sum(c, context) * d_attn
    # A state-space layer's chunked scan (forward, _ssm_scan_flops); backward twice that.
    scan = _mixers(c)["ssm"] * 3 * _ssm_scan_flops(c, context)
    return 6 * matmul_parameters(c) + attention + scan


def translation_batch_flops(config: ModelConfig, sentences: int, source: int, target: int) -> int:
    """Forward + backward FLOPs of one encoder-decoder training batch of ``sentences`` padded
    to ``source`` and ``target`` tokens, padding included (it is computed): per padded token
    6 × the matrix weights it meets (encoder layers and the cross-attention keys and values on
    the source; the rest of the decoder layers and the output projection on the target), plus the attention pairs -- encoder S², decoder T²
    (unmasked, as the kernels compute it) and cross T·S -- at 12 (dot) or 15 (additive) per
    pair and head dimension, as ``training_flops_per_token`` counts them."""
    c = config
    if c.arch != "encoder-decoder":
        raise UserError(f"translation_batch_flops needs arch='encoder-decoder', got {c.arch!r}")
    if c.rnn.cell is not None:
        return _rnn_batch_flops(c, sentences, source, target)
    attention, ffn = _attention_weights(c), _ffn_active_weights(c)
    cross_kv = 2 * c.d_model * c.kv_heads * c.head_dim  # cross-attention K, V: on the source
    encoder = c.n_layers * (attention + ffn) + c.decoder_layers * cross_kv
    decoder = c.decoder_layers * (2 * attention - cross_kv + ffn) + c.vocab_size * c.d_model
    d_attn = c.attention.n_heads * c.head_dim
    per_pair = 12 if c.attention.score == "dot" else 15
    pairs = c.n_layers * source * source + c.decoder_layers * (target * target + target * source)
    return sentences * (6 * (encoder * source + decoder * target) + per_pair * pairs * d_attn)


def _rnn_batch_flops(c: ModelConfig, sentences: int, source: int, target: int) -> int:
    """The recurrent baselines (aiayn/models/rnn.py), by the same convention: 6 × the matrix
    weights each padded token meets -- a GRU layer has 3 gates (an LSTM 4), each with an input
    and a recurrent matrix; the encoder's two directions have d/2 units each -- plus, with
    attention, the key projection on the source, the query projection and the output
    combination on the target, and 15 FLOPs per query-key pair and dimension (additive score
    3, weighted sum 2, times 3 for training), and the bridge to the initial state."""
    gates, d = (3 if c.rnn.cell == "gru" else 4), c.d_model
    h = d // 2
    encoder = c.n_layers * 2 * gates * (d * h + h * h)  # per source token
    decoder = c.decoder_layers * gates * 2 * d * d + c.vocab_size * d  # per target token
    pairs = 0
    if c.rnn.attention:
        encoder += d * d  # U h
        decoder += d * d + 2 * d * d  # W s, W_c [s; c]
        pairs = 15 * source * target * d
    return sentences * (6 * (encoder * source + decoder * target + d * d) + pairs)


def forward_flops_per_token(config: ModelConfig, context: int) -> int:
    """Forward-pass FLOPs per token, one third of training: ``2·N_matmul + 4·L·T·d_attn``."""
    return training_flops_per_token(config, context) // 3


# ----- memory ---------------------------------------------------------------------------------


def kv_cache_bytes_per_token(config: ModelConfig, dtype_bytes: int | str = 2) -> int:
    """Self-attention KV cache per cached position: ``2 · L_dec · n_kv_heads · d_head · bytes``.

    L_dec is the decoder's layers (all layers of a decoder-only model).  An encoder-only
    model decodes nothing and has no cache: 0.
    """
    c = config
    if c.arch == "encoder":
        return 0
    return 2 * softmax_layers(c) * c.kv_heads * c.head_dim * dtype_size(dtype_bytes)


def recurrent_state_bytes(config: ModelConfig, batch: int = 1) -> int:
    """The fixed-size decoding state of the recurrent layers, whatever the context, in fp32:
    linear attention's S (d_head x d_head) and z (d_head) per head (aiayn/nn/
    linear_attention.py), a state-space layer's last K - 1 conv inputs (x, B and C) and its
    E x N state
    (aiayn/nn/ssm.py) -- 0 for a model with softmax attention only."""
    c = config
    if c.arch != "decoder":
        return 0
    linear = sum(c.mixer_at(i) == "linear" for i in range(c.n_layers))
    e, _, n, k = _ssm_sizes(c)
    ssm = _mixers(c)["ssm"] * ((e + 2 * n) * (k - 1) + e * n)  # the conv window and h
    return batch * 4 * (linear * c.attention.n_heads * c.head_dim * (c.head_dim + 1) + ssm)


def kv_cached_positions(config: ModelConfig, context: int) -> int:
    """Positions the cache holds after ``context`` tokens: at most ``sliding_window``."""
    _positive("context", context)
    w = config.attention.sliding_window
    return context if w is None else min(context, w)


def kv_cache_bytes(
    config: ModelConfig, context: int, batch: int = 1, dtype_bytes: int | str = 2
) -> int:
    """The whole decoding cache for ``batch`` sequences of ``context`` tokens -- what
    ``model.new_cache(batch, context).nbytes()`` holds once they are decoded: the softmax
    layers' keys and values (a sliding window caps the cached positions at the window, a
    rolling cache) and the linear-attention layers' fixed states."""
    _positive("batch", batch)
    kv = kv_cache_bytes_per_token(config, dtype_bytes) * kv_cached_positions(config, context)
    return kv * batch + recurrent_state_bytes(config, batch)


def cross_kv_cache_bytes(
    config: ModelConfig, source_len: int, batch: int = 1, dtype_bytes: int | str = 2
) -> int:
    """An encoder-decoder's cross-attention keys and values, computed once per source
    sentence: ``2 · L_dec · n_kv_heads · d_head · S · B · bytes``; 0 for other families."""
    _positive("source_len", source_len)
    _positive("batch", batch)
    if config.arch != "encoder-decoder":
        return 0
    return kv_cache_bytes_per_token(config, dtype_bytes) * source_len * batch


def attention_score_bytes(
    config: ModelConfig, context: int, batch: int = 1, dtype_bytes: int | str = 2
) -> int:
    """One attention sublayer's (B, H, T, T) score matrix, ``B·H·T·T·bytes``.

    The reference backend materialises it (a sliding window masks it but does not shrink
    it); memory-efficient attention (``sdpa``, ``flash``) never does.  Training with the
    reference backend keeps at least one such matrix per attention sublayer for backward.
    """
    _positive("context", context)
    _positive("batch", batch)
    return batch * config.attention.n_heads * context * context * dtype_size(dtype_bytes)


# Precisions of decoding (aiayn/models/precision.py): bytes per linear weight, per cached key or
# value element, per activation element.  int8 weights keep an fp32 KV cache unless the cache is
# asked for in bf16; an encoder-decoder's cross-attention keys and values are activations (the
# projected encoder output), kept in the model's dtype whatever the cache's.
DECODING_PRECISIONS: dict[str, tuple[int, int, int]] = {
    "float32": (4, 4, 4),
    "bfloat16": (2, 2, 2),
    "int8": (1, 4, 4),
    "int8 + bf16 KV cache": (1, 2, 4),
}


def decoding_matmul_parameters(config: ModelConfig) -> int:
    """The matmul weights one decoded token goes through: all of them for a decoder-only
    model, the decoder's and the output projection for an encoder-decoder (the encoder runs
    once per sentence, not per token)."""
    c = _transformer(config)
    n = matmul_parameters(c)
    if c.arch == "encoder-decoder":
        n -= c.n_layers * (_attention_weights(c) + _ffn_active_weights(c))
    return n


def decoding_bytes_per_token(config: ModelConfig, context: int, precision: str) -> int:
    """Bytes read to decode one token at batch 1 after ``context`` cached tokens: every
    decoding weight once (``decoding_matmul_parameters``, plus one fp32 scale per output
    row for int8) and every cached key and value (an encoder-decoder's cross-attention keys
    and values of a ``context``-token source too).  At batch 1 decoding is bound by these
    reads, so they bound its speed: tokens/s <= memory bandwidth / bytes."""
    if precision not in DECODING_PRECISIONS:
        raise UserError(
            f"precision {precision!r} is invalid: expected one of {', '.join(DECODING_PRECISIONS)}"
        )
    c = config
    if c.arch == "encoder":
        return 0
    weight_bytes, kv_bytes, activation_bytes = DECODING_PRECISIONS[precision]
    n = decoding_matmul_parameters(c)
    scales = 4 * (n // c.d_model) if weight_bytes == 1 else 0  # about one row per d_model
    cached = kv_cache_bytes_per_token(c, kv_bytes) * kv_cached_positions(c, context)
    cross = cross_kv_cache_bytes(c, context, 1, activation_bytes)  # 0 without an encoder
    return n * weight_bytes + scales + cached + cross
