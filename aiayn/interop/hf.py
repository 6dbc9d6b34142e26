"""Weight conversion between ``DecoderLM`` and Hugging Face
``transformers`` GPT-2 (``GPT2LMHeadModel``) and the Llama family: Llama
(``LlamaForCausalLM``), Mistral (the same, with a sliding window), Qwen2 (the same, with
biases on the q, k and v projections) and Mixtral (Mistral with a mixture of experts: HF's
router, softmax over all experts, top k, renormalised, is aiayn/nn/moe.py's).

Both directions are strict: every parameter on each side is mapped exactly once (shared,
tied tensors count once; non-parameter buffers such as GPT-2's ``attn.bias`` causal masks or
Llama's ``rotary_emb.inv_freq`` are not weights), and any HF option aiayn cannot express
raises ``ValueError`` naming the field.  Converted models give the same logits as the source
(tests/interop/test_hf.py), which makes HF a reference for correctness and for benchmarks.

Name mapping (per layer ``i``; aiayn <- GPT-2 | Llama):

* embed.token <- transformer.wte | model.embed_tokens
* embed.positions <- transformer.wpe | (rotary: no weights)
* blocks.i.norm1 <- h.i.ln_1 | layers.i.input_layernorm
* blocks.i.self_attn.qkv <- h.i.attn.c_attn (Conv1D, transposed) | cat(q_proj, k_proj, v_proj)
* blocks.i.self_attn.out <- h.i.attn.c_proj (Conv1D) | layers.i.self_attn.o_proj
* blocks.i.norm2 <- h.i.ln_2 | layers.i.post_attention_layernorm
* blocks.i.ffn.w1 / w13 <- h.i.mlp.c_fc (Conv1D) | cat(gate_proj, up_proj)
* blocks.i.ffn.w2 <- h.i.mlp.c_proj (Conv1D) | layers.i.mlp.down_proj
* blocks.i.ffn.router / experts.e.w13 / experts.e.w2 <- (Mixtral) mlp.gate /
  mlp.experts.gate_up_proj[e] / mlp.experts.down_proj[e]; on the Hub, block_sparse_moe.gate /
  cat(experts.e.w1, experts.e.w3) / experts.e.w2
* decoder.norm <- transformer.ln_f | model.norm
* head <- lm_head (tied to wte by default) | lm_head (unless tie_word_embeddings)

``transformers`` is imported lazily: it is a test/benchmark dependency, not a runtime one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal, TypeVar

import torch
from torch import Tensor, nn

from aiayn.config import Activation, ModelConfig
from aiayn.errors import CheckpointError
from aiayn.models.decoder import DecoderLM

# (our parameter, HF parameters concatenated along our dim 0, HF stores it transposed)
NameMap = list[tuple[str, tuple[str, ...], bool]]
M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class Reading:
    """What a Hugging Face folder of one family holds, in aiayn's terms (each family's
    ``read`` in aiayn/interop/families.py gives one)."""

    config: ModelConfig
    names: NameMap  # aiayn parameter <- the HF tensors that fill it
    skipped: frozenset[str] = frozenset()  # stored, but no weight of their own (tied copies)


@dataclass(frozen=True)
class LlamaVariant:
    """What sets one member of the Llama family apart; HF's classes are ``{name}Config`` and
    ``{name}ForCausalLM``.  ``window``: "never" (Llama), "always" (Mistral's
    ``sliding_window``, on every layer when set) or "opt-in" (Qwen2's, only with
    ``use_sliding_window``)."""

    name: str
    window: Literal["never", "always", "opt-in"]
    qkv_bias: bool = False  # Qwen2Attention: q/k/v_proj with bias, o_proj without
    experts: bool = False  # Mixtral: a router and experts in place of the MLP


LLAMA = LlamaVariant("Llama", "never")
MISTRAL = LlamaVariant("Mistral", "always")
QWEN2 = LlamaVariant("Qwen2", "opt-in", qkv_bias=True)
MIXTRAL = LlamaVariant("Mixtral", "always", experts=True)

# GPT2Config.activation_function -> ours ("gelu_new" is GPT-2's tanh approximation of GELU)
_GPT2_ACTIVATIONS: dict[str, Activation] = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}
_GPT2_ACTIVATIONS_BACK = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # the optional extra: aiayn.extras names it
        raise ModuleNotFoundError(
            "converting this Hugging Face checkpoint needs transformers: pip install 'aiayn[hf]'",
            name="transformers",
        ) from err
    return transformers


def _check(owner: str, obj: Any, **allowed: tuple[object, ...]) -> None:
    """Raise ValueError naming the first field of ``obj`` whose value is not in ``allowed``."""
    for name, ok in allowed.items():
        # A ModelConfig's settings by their flat names (n_heads); an HF config's field absent
        # (older/newer HF) = the representable default.
        is_ours = isinstance(obj, ModelConfig)
        value = obj.value(name) if is_ours else getattr(obj, name, ok[0])
        if value not in ok:
            raise CheckpointError(
                f"{owner} {name}={value!r} cannot be converted: expected one of {ok}"
            )


# ----- configs ------------------------------------------------------------------------------


def config_from_gpt2(hf_config: Any) -> ModelConfig:
    """``GPT2Config`` -> decoder-only, pre-LN, learned positions, GELU, biases, tied head."""
    c = hf_config
    _check("GPT2Config", c, activation_function=tuple(_GPT2_ACTIVATIONS))
    _check("GPT2Config", c, scale_attn_weights=(True,), add_cross_attention=(False,))
    _check("GPT2Config", c, scale_attn_by_inverse_layer_idx=(False,))
    return ModelConfig.from_dict(
        dict(
            arch="decoder",
            vocab_size=c.vocab_size,
            n_layers=c.n_layer,
            d_model=c.n_embd,
            n_heads=c.n_head,
            d_ff=c.n_inner or 4 * c.n_embd,
            max_len=c.n_positions,
            positional="learned",
            norm="layernorm",
            norm_position="pre",
            norm_eps=c.layer_norm_epsilon,
            activation=_GPT2_ACTIVATIONS[c.activation_function],
            bias=True,
            dropout=c.resid_pdrop,
            attention_dropout=c.attn_pdrop,
            scale_embeddings=False,
            tie_embeddings=getattr(c, "tie_word_embeddings", True),
            pad_id=None,
            init_std=c.initializer_range,
        )
    )


def _llama_rope(c: Any) -> tuple[float, float]:
    """(rope_base, rope_scaling) from transformers 5.x ``rope_parameters`` or 4.x
    ``rope_theta`` + ``rope_scaling``.  Only unscaled and linear (position interpolation)."""
    params = dict(getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {})
    theta = params.get("rope_theta", getattr(c, "rope_theta", None) or 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", None))
    rope = SimpleNamespace(rope_type=kind, partial_rotary_factor=partial)
    _check("LlamaConfig.rope_parameters", rope, rope_type=("default", "linear"))
    _check("LlamaConfig.rope_parameters", rope, partial_rotary_factor=(None, 1.0))
    return float(theta), float(params["factor"]) if kind == "linear" else 1.0


def _sliding_window(c: Any, variant: LlamaVariant) -> int | None:
    """Mistral's ``sliding_window`` (every layer); Qwen2's only when ``use_sliding_window``,
    which must then cover every layer (aiayn windows all layers or none)."""
    if variant.window == "never":
        return None
    if variant.window == "opt-in":
        if not getattr(c, "use_sliding_window", False):
            return None
        if getattr(c, "max_window_layers", 0) not in (0,):
            raise CheckpointError(
                f"Qwen2Config max_window_layers={c.max_window_layers} cannot be converted: aiayn"
                " windows every layer or none (expected 0 with use_sliding_window)"
            )
    window = getattr(c, "sliding_window", None)
    return int(window) if window else None


def config_from_llama(hf_config: Any, variant: LlamaVariant = LLAMA) -> ModelConfig:
    """``LlamaConfig`` -> RMSNorm, SwiGLU, rotary positions, grouped-query attention, no bias.
    The same family (``variant``): ``MistralConfig`` (+ a sliding window), ``Qwen2Config``
    (+ biases on q, k and v) and ``MixtralConfig`` (+ a mixture of experts)."""
    c = hf_config
    owner = f"{variant.name}Config"
    _check(owner, c, hidden_act=("silu",), mlp_bias=(False,))
    experts: dict[str, Any] = {}
    if variant.experts:  # experts of size intermediate_size, the top k mixed (aiayn/nn/moe.py)
        _check(owner, c, router_jitter_noise=(0.0, None))
        experts = {"n_experts": c.num_local_experts, "experts_top_k": c.num_experts_per_tok}
    qkv_bias: bool | None = None
    if variant.qkv_bias:
        qkv_bias = True
    else:
        _check(owner, c, attention_bias=(False,))
    window = _sliding_window(c, variant)
    rope_base, rope_scaling = _llama_rope(c)
    head_dim = getattr(c, "head_dim", None)
    return ModelConfig.from_dict(
        dict(
            arch="decoder",
            vocab_size=c.vocab_size,
            n_layers=c.num_hidden_layers,
            d_model=c.hidden_size,
            n_heads=c.num_attention_heads,
            n_kv_heads=c.num_key_value_heads or c.num_attention_heads,
            d_head=None if head_dim in (None, c.hidden_size // c.num_attention_heads) else head_dim,
            d_ff=c.intermediate_size,
            max_len=c.max_position_embeddings,
            positional="rope",
            rope_base=rope_base,
            rope_scaling=rope_scaling,
            norm="rmsnorm",
            norm_position="pre",
            norm_eps=c.rms_norm_eps,
            activation="swiglu",
            bias=False,
            dropout=0.0,
            attention_dropout=float(getattr(c, "attention_dropout", 0.0) or 0.0),
            scale_embeddings=False,
            tie_embeddings=bool(c.tie_word_embeddings),
            pad_id=None,
            init_std=c.initializer_range,
            qkv_bias=qkv_bias,
            sliding_window=window,
            **experts,
        )
    )


def _gpt2_config(config: ModelConfig, attn_implementation: str | None) -> Any:
    """ModelConfig -> ``GPT2Config`` (inverse of ``config_from_gpt2``)."""
    c = config
    want = "ModelConfig (for GPT-2)"
    _check(want, c, arch=("decoder",), positional=("learned",), norm=("layernorm",))
    _check(want, c, norm_position=("pre",), activation=tuple(_GPT2_ACTIVATIONS_BACK))
    _check(want, c, bias=(True,), scale_embeddings=(False,), kv_heads=(c.attention.n_heads,))
    _check(want, c, head_dim=(c.d_model // c.attention.n_heads,))
    _check(want, c, attention_score=("dot",), attention_scale=(True,), residual=(True,))
    # GPT-2's default special token 50256 only exists in its own vocabulary.
    special = {} if c.vocab_size > 50256 else {"bos_token_id": None, "eos_token_id": None}
    return _transformers().GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.max_len,
        n_embd=c.d_model,
        n_layer=c.n_layers,
        n_head=c.attention.n_heads,
        n_inner=c.ffn.d_ff,
        activation_function=_GPT2_ACTIVATIONS_BACK[c.ffn.activation],
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.attention.dropout,
        layer_norm_epsilon=c.norm_eps,
        initializer_range=c.init_std,
        tie_word_embeddings=c.tie_embeddings,
        attn_implementation=attn_implementation,
        **special,
    )


def _llama_config(
    config: ModelConfig, attn_implementation: str | None, variant: LlamaVariant = LLAMA
) -> Any:
    """ModelConfig -> ``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config`` /
    ``MixtralConfig`` (inverse of ``config_from_llama``).  They have no
    embedding/residual dropout, so ``config.dropout`` (training only) is dropped."""
    c = config
    want = f"ModelConfig (for {variant.name})"
    _check(want, c, arch=("decoder",), positional=("rope",), norm=("rmsnorm",))
    _check(want, c, norm_position=("pre",), activation=("swiglu",))
    _check(want, c, bias=(False,), scale_embeddings=(False,))
    _check(want, c, attention_score=("dot",), attention_scale=(True,), residual=(True,))
    _check(want, c, mixer=("attention",), projection_bias=(variant.qkv_bias,))
    _check(want, c, n_experts=(c.ffn.n_experts,) if variant.experts else (None,))
    _check(want, c, expert_capacity_factor=(None,))  # HF computes every assignment
    if variant.window == "never":
        _check(want, c, sliding_window=(None,))
    p = c.positions
    scaling = None if p.rope_scaling == 1.0 else {"rope_type": "linear", "factor": p.rope_scaling}
    extra: dict[str, Any] = {}
    if variant.window == "always":
        extra["sliding_window"] = c.attention.sliding_window
    if variant.experts:
        if c.ffn.n_experts is None:
            raise CheckpointError(
                "ModelConfig (for Mixtral) n_experts=None: Mixtral is a mixture of experts"
            )
        extra.update(
            num_local_experts=c.ffn.n_experts,
            num_experts_per_tok=c.ffn.top_k,
            router_jitter_noise=0.0,
        )
    elif variant.window == "opt-in":
        window = c.attention.sliding_window is not None
        extra.update(
            use_sliding_window=window,
            sliding_window=c.attention.sliding_window,
            max_window_layers=0 if window else c.n_layers,
        )
    return getattr(_transformers(), f"{variant.name}Config")(
        **extra,
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.ffn.d_ff,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.attention.n_heads,
        num_key_value_heads=c.kv_heads,
        head_dim=c.head_dim,
        hidden_act="silu",
        max_position_embeddings=c.max_len,
        rms_norm_eps=c.norm_eps,
        rope_theta=p.rope_base,
        rope_scaling=scaling,
        attention_dropout=c.attention.dropout,
        initializer_range=c.init_std,
        tie_word_embeddings=c.tie_embeddings,
        attn_implementation=attn_implementation,
    )


# ----- weights ------------------------------------------------------------------------------


def _gpt2_names(config: ModelConfig) -> NameMap:
    # Conv1D stores y = x W + b with W (in, out): our nn.Linear weight (out, in) is W^T.
    # c_attn's columns are [q | k | v], so W^T's rows are [W_q; W_k; W_v] -- our qkv layout.
    names: NameMap = [
        ("embed.token.weight", ("transformer.wte.weight",), False),
        ("embed.positions.weight", ("transformer.wpe.weight",), False),
        ("decoder.norm.weight", ("transformer.ln_f.weight",), False),
        ("decoder.norm.bias", ("transformer.ln_f.bias",), False),
    ]
    for i in range(config.n_layers):
        ours, hf = f"decoder.blocks.{i}.", f"transformer.h.{i}."
        for a, b, is_conv in (
            ("norm1", "ln_1", False),
            ("self_attn.qkv", "attn.c_attn", True),
            ("self_attn.out", "attn.c_proj", True),
            ("norm2", "ln_2", False),
            ("ffn.w1", "mlp.c_fc", True),
            ("ffn.w2", "mlp.c_proj", True),
        ):
            names.append((f"{ours}{a}.weight", (f"{hf}{b}.weight",), is_conv))
            names.append((f"{ours}{a}.bias", (f"{hf}{b}.bias",), False))
    if not config.tie_embeddings:
        names.append(("head.weight", ("lm_head.weight",), False))
    return names


def _llama_names(config: ModelConfig, experts: str = "") -> NameMap:
    """Llama's names; Mistral's are the same, Qwen2 adds the q, k, v biases, and Mixtral has
    a router and experts in place of the MLP: ``experts`` "fused" (transformers 5's modules:
    one (E, 2F, C) gate_up_proj and one (E, C, F) down_proj per layer, expert e their slice
    ``[e]``) or "per-expert" (the checkpoints on the Hub: block_sparse_moe.experts.e.w1/w3/w2)."""
    names: NameMap = [
        ("embed.token.weight", ("model.embed_tokens.weight",), False),
        ("decoder.norm.weight", ("model.norm.weight",), False),
    ]
    for i in range(config.n_layers):
        ours, hf = f"decoder.blocks.{i}.", f"model.layers.{i}."
        attn, mlp = f"{hf}self_attn.", f"{hf}mlp."
        names += [
            (f"{ours}norm1.weight", (f"{hf}input_layernorm.weight",), False),
            # (H D + 2 H_kv D, C) = [q_proj (H D, C); k_proj (H_kv D, C); v_proj (H_kv D, C)]
            (f"{ours}self_attn.qkv.weight", tuple(f"{attn}{p}_proj.weight" for p in "qkv"), False),
            *(
                [(f"{ours}self_attn.qkv.bias", tuple(f"{attn}{p}_proj.bias" for p in "qkv"), False)]
                if config.projection_bias
                else []
            ),
            (f"{ours}self_attn.out.weight", (f"{attn}o_proj.weight",), False),
            (f"{ours}norm2.weight", (f"{hf}post_attention_layernorm.weight",), False),
        ]
        if config.ffn.n_experts is None:
            names += [
                # (2 F, C) = [gate_proj (F, C) = W1; up_proj (F, C) = W3]
                (
                    f"{ours}ffn.w13.weight",
                    (f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight"),
                    False,
                ),
                (f"{ours}ffn.w2.weight", (f"{mlp}down_proj.weight",), False),
            ]
            continue
        moe = f"{hf}mlp." if experts == "fused" else f"{hf}block_sparse_moe."
        names.append((f"{ours}ffn.router.weight", (f"{moe}gate.weight",), False))
        for e in range(config.ffn.n_experts):
            mine = f"{ours}ffn.experts.{e}."
            if experts == "fused":  # gate_up_proj[e] is [gate; up] = [W1; W3], our w13
                names += [
                    (f"{mine}w13.weight", (f"{moe}experts.gate_up_proj[{e}]",), False),
                    (f"{mine}w2.weight", (f"{moe}experts.down_proj[{e}]",), False),
                ]
            else:
                x = f"{moe}experts.{e}."
                names += [
                    (f"{mine}w13.weight", (f"{x}w1.weight", f"{x}w3.weight"), False),
                    (f"{mine}w2.weight", (f"{x}w2.weight",), False),
                ]
    if not config.tie_embeddings:
        names.append(("head.weight", ("lm_head.weight",), False))
    return names


def weights_and_biases(
    ours: str, hf: str, modules: Sequence[tuple[str, str | tuple[str, ...]]]
) -> NameMap:
    """The weight and the bias of each (our module, its HF module -- or modules, concatenated
    along dim 0) under the prefixes ``ours`` and ``hf``: one block of a biased model."""
    names: NameMap = []
    for mine, theirs in modules:
        parts = (theirs,) if isinstance(theirs, str) else theirs
        for kind in ("weight", "bias"):
            names.append((f"{ours}{mine}.{kind}", tuple(f"{hf}{t}.{kind}" for t in parts), False))
    return names


def _assign(dst: Tensor, src: Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise CheckpointError(
            f"weight {name}: shape {tuple(src.shape)} does not fit {tuple(dst.shape)}"
        )
    dst.copy_(src)


def split_index(name: str) -> tuple[str, int | slice | None]:
    """ "a.b[3]" -> ("a.b", 3): slice 3 (along dim 0) of the HF tensor a.b; "a.b[2:]" ->
    ("a.b", slice(2, None)): its rows from 2 on (BART's offset position table); "a.b" ->
    ("a.b", None)."""
    if name.endswith("]"):
        base, _, index = name[:-1].rpartition("[")
        if index.endswith(":"):
            return base, slice(int(index[:-1]), None)
        return base, int(index)
    return name, None


@torch.no_grad()
def _copy(ours: nn.Module, hf: nn.Module, names: NameMap, *, to_hf: bool, family: str) -> None:
    """Copy every mapped weight (HF -> ours, or ours -> HF if ``to_hf``); strict both sides.
    An HF name may also be a buffer that holds a weight (Marian's ``final_logits_bias``)."""
    mine, stored = dict(ours.named_parameters()), dict(hf.named_parameters())  # tied: once
    buffers = dict(hf.named_buffers())
    theirs: dict[str, Tensor] = {}
    for _, hs, _ in names:
        for h in hs:
            base, index = split_index(h)
            found = stored.get(base, buffers.get(base))
            if found is not None:
                theirs[h] = found if index is None else found[index]
    hf_mapped = {split_index(h)[0] for _, hs, _ in names for h in hs}
    for side, params, mapped in (
        ("aiayn", mine, {o for o, _, _ in names}),
        (family, stored, hf_mapped - (set(buffers) - set(stored))),
    ):
        if set(params) != mapped:
            raise CheckpointError(
                f"{family} conversion: {side} weights left unmapped {sorted(set(params) - mapped)},"
                f" expected but absent {sorted(mapped - set(params))}"
            )
    for o, hs, transposed in names:
        parts = [theirs[h].t() if transposed else theirs[h] for h in hs]  # each in our layout
        if to_hf:
            chunks = mine[o].split([p.shape[0] for p in parts], dim=0)
            for h, chunk in zip(hs, chunks, strict=True):
                _assign(theirs[h], chunk.t() if transposed else chunk, h)
        else:
            _assign(mine[o], torch.cat(parts, dim=0), o)


def copied_from_hf(model: M, hf_model: nn.Module, names: NameMap, family: str) -> M:
    """``model``, freshly built, with ``hf_model``'s weights, device, dtype and mode."""
    _copy(model, hf_model, names, to_hf=False, family=family)
    ref = next(hf_model.parameters())
    return model.to(device=ref.device, dtype=ref.dtype).train(hf_model.training)


def copied_to_hf(model: nn.Module, hf_model: M, names: NameMap, family: str) -> M:
    """``hf_model``, freshly built, with ``model``'s weights, device, dtype and mode."""
    _copy(model, hf_model, names, to_hf=True, family=family)
    ref = next(model.parameters())
    return hf_model.to(device=ref.device, dtype=ref.dtype).train(model.training)


def experts_layout(names: Iterable[str]) -> str:
    """How a Mixtral's experts are stored, from its tensor names: "per-expert" (the Hub's
    checkpoints, transformers 4.x) or "fused" (transformers 5)."""
    return "per-expert" if any(".block_sparse_moe." in n for n in names) else "fused"


def from_hf_gpt2(hf_model: Any) -> DecoderLM:
    """A ``GPT2LMHeadModel`` as a ``DecoderLM`` with identical weights."""
    config = config_from_gpt2(hf_model.config)
    return copied_from_hf(DecoderLM(config), hf_model, _gpt2_names(config), "GPT-2")


def to_hf_gpt2(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``GPT2LMHeadModel`` with ``model``'s weights (its config must be GPT-2 shaped)."""
    hf_config = _gpt2_config(model.config, attn_implementation)
    hf_model = _transformers().GPT2LMHeadModel(hf_config)
    return copied_to_hf(model, hf_model, _gpt2_names(model.config), "GPT-2")


def read_gpt2(hf_config: Any, stored: Collection[str]) -> Reading:
    """A GPT-2 folder's config and name map."""
    config = config_from_gpt2(hf_config)
    return Reading(config, _gpt2_names(config))


def write_gpt2(config: ModelConfig) -> tuple[Any, NameMap]:
    """The ``GPT2Config`` (naming ``GPT2LMHeadModel``) and name map of a GPT-2 folder."""
    hf_config = _gpt2_config(config, None)
    hf_config.architectures = ["GPT2LMHeadModel"]
    return hf_config, _gpt2_names(config)


def llama_from_hf(hf_model: Any, variant: LlamaVariant) -> DecoderLM:
    """A ``{variant.name}ForCausalLM`` as a ``DecoderLM`` with identical weights."""
    config = config_from_llama(hf_model.config, variant)
    layout = experts_layout(n for n, _ in hf_model.named_parameters())
    return copied_from_hf(DecoderLM(config), hf_model, _llama_names(config, layout), variant.name)


def llama_to_hf(model: DecoderLM, variant: LlamaVariant, attn_implementation: str | None) -> Any:
    """A ``{variant.name}ForCausalLM`` with ``model``'s weights."""
    hf_config = _llama_config(model.config, attn_implementation, variant)
    hf_model = getattr(_transformers(), f"{variant.name}ForCausalLM")(hf_config)
    layout = experts_layout(n for n, _ in hf_model.named_parameters())
    return copied_to_hf(model, hf_model, _llama_names(model.config, layout), variant.name)


def read_llama(hf_config: Any, stored: Collection[str], variant: LlamaVariant) -> Reading:
    """A Llama-family folder's config and name map (a Mixtral's experts as they are stored)."""
    config = config_from_llama(hf_config, variant)
    return Reading(config, _llama_names(config, experts_layout(stored)))


def write_llama(config: ModelConfig, variant: LlamaVariant) -> tuple[Any, NameMap]:
    """The HF config and name map of a Llama-family folder; a Mixtral's experts in the Hub's
    layout, one w1/w2/w3 per expert, which every transformers version reads."""
    hf_config = _llama_config(config, None, variant)
    hf_config.architectures = [f"{variant.name}ForCausalLM"]
    return hf_config, _llama_names(config, "per-expert")


def from_hf_llama(hf_model: Any) -> DecoderLM:
    """A ``LlamaForCausalLM`` as a ``DecoderLM`` with identical weights."""
    return llama_from_hf(hf_model, LLAMA)


def to_hf_llama(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``LlamaForCausalLM`` with ``model``'s weights (its config must be Llama shaped)."""
    return llama_to_hf(model, LLAMA, attn_implementation)


def to_hf_mistral(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``MistralForCausalLM`` with ``model``'s weights."""
    return llama_to_hf(model, MISTRAL, attn_implementation)


def to_hf_qwen2(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``Qwen2ForCausalLM`` with ``model``'s weights."""
    return llama_to_hf(model, QWEN2, attn_implementation)


def to_hf_mixtral(model: DecoderLM, *, attn_implementation: str | None = None) -> Any:
    """A ``MixtralForCausalLM`` with ``model``'s weights."""
    return llama_to_hf(model, MIXTRAL, attn_implementation)
