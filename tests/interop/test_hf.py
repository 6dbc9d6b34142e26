"""aiayn's DecoderLM against Hugging Face GPT-2 and Llama with identical (random) weights.

Tiny models are built from configs: nothing is downloaded.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import Tensor, nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers

from aiayn.config import ModelConfig
from aiayn.interop.families import from_hf
from aiayn.interop.gpt2 import config_from_gpt2, from_hf_gpt2, to_hf_gpt2
from aiayn.interop.llama import (
    config_from_llama,
    from_hf_llama,
    to_hf_llama,
    to_hf_mistral,
    to_hf_qwen2,
)
from aiayn.models.decoder import DecoderLM
from tests.interop.support import assert_same_state, perturb

# fp32, HF sums in other orders: GPT-2's 256-term dots, ~sqrt(256) x 2^-24 ~ 1e-6; CPU: <= 1.2e-6
TOL = {"atol": 1e-5, "rtol": 1e-5}
VOCAB = 101


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def gpt2(attn: str = "eager", **overrides: object) -> nn.Module:
    kwargs: dict = dict(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=32,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    kwargs.update(overrides)
    config = transformers.GPT2Config(**kwargs, attn_implementation=attn)
    model = transformers.GPT2LMHeadModel(config).eval()
    # HF initialises ln_1, ln_2, ln_f to (1, 0) and every bias to 0: moved, as are the token
    # and position embeddings, so that a swapped norm or a dropped bias changes the logits.
    return perturb(model, ("ln_", "wte", "wpe"))


def llama(
    attn: str = "eager", theta: float = 10000.0, tied: bool = False, **overrides: object
) -> nn.Module:
    kwargs: dict = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rope_theta=theta,
        tie_word_embeddings=tied,
    )
    kwargs.update(overrides)
    config = transformers.LlamaConfig(**kwargs, attn_implementation=attn)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF initialises norms to 1: perturb them so they are tested too
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


LLAMAS = [
    pytest.param("eager", 10000.0, False, id="eager-theta1e4-untied"),
    pytest.param("sdpa", 500000.0, True, id="sdpa-theta5e5-tied"),
]


def hf_logits(hf: nn.Module, ids: Tensor, **kwargs: object) -> Tensor:
    with torch.no_grad():
        return hf(input_ids=ids, **kwargs).logits


def ours_logits(model: DecoderLM, ids: Tensor, **kwargs: object) -> Tensor:
    with torch.no_grad():
        return model(ids, **kwargs)


def incremental(model: DecoderLM, ids: Tensor) -> Tensor:
    """Logits from feeding ``ids`` one token at a time through the KV cache."""
    cache = model.new_cache(ids.shape[0], ids.shape[1])
    with torch.no_grad():
        steps = [model(ids[:, i : i + 1], cache=cache) for i in range(ids.shape[1])]
    return torch.cat(steps, dim=1)  # (B, T, V)


def left_padded(batch: int = 3, length: int = 12) -> tuple[Tensor, Tensor]:
    """Random ids (B, T) and a long (B, T) mask with 0, 5 and 9 left pad tokens."""
    ids = torch.randint(0, VOCAB, (batch, length))
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, pad in enumerate((0, 5, 9)[:batch]):
        mask[row, :pad] = 0
    return ids, mask


# ----- configs ------------------------------------------------------------------------------


def test_config_from_gpt2() -> None:
    c = config_from_gpt2(gpt2().config)
    assert (c.arch, c.positions.scheme, c.norm_position, c.ffn.activation) == (
        "decoder",
        "learned",
        "pre",
        "gelu_tanh",
    )
    a, f = c.attention, c.ffn
    assert (c.d_model, a.n_heads, c.n_layers, f.d_ff, c.max_len) == (64, 4, 2, 256, 32)
    assert c.tie_embeddings and c.bias and not c.scale_embeddings and c.pad_id is None
    assert (
        config_from_gpt2(transformers.GPT2Config(activation_function="gelu")).ffn.activation
        == "gelu"
    )


def test_config_from_llama() -> None:
    c = config_from_llama(llama(theta=500000.0, tied=True).config)
    a, f, p = c.attention, c.ffn, c.positions
    assert (p.scheme, c.norm, f.activation, c.bias) == ("rope", "rmsnorm", "swiglu", False)
    assert (a.n_heads, c.kv_heads, c.head_dim, f.d_ff, c.max_len) == (4, 2, 16, 96, 64)
    assert p.rope_base == 500000.0 and p.rope_scaling == 1.0 and c.tie_embeddings


@pytest.mark.parametrize(
    ("make", "overrides", "field"),
    [
        (llama, {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type"),
        (llama, {"attention_bias": True}, "attention_bias"),
        (llama, {"mlp_bias": True}, "mlp_bias"),
        (llama, {"hidden_act": "gelu"}, "hidden_act"),
        (gpt2, {"activation_function": "silu"}, "activation_function"),
        (gpt2, {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ],
)
def test_unsupported_hf_config_raises(make, overrides: dict, field: str) -> None:
    hf = make(**overrides)
    convert = from_hf_llama if make is llama else from_hf_gpt2
    with pytest.raises(ValueError, match=field):
        convert(hf)


def test_unsupported_model_config_raises() -> None:
    llama_like = DecoderLM(config_from_llama(llama().config))
    with pytest.raises(ValueError, match="positions.scheme"):
        to_hf_gpt2(llama_like)
    gpt2_like = DecoderLM(config_from_gpt2(gpt2().config))
    with pytest.raises(ValueError, match="positions.scheme"):
        to_hf_llama(gpt2_like)
    with pytest.raises(ValueError, match="scale_embeddings"):
        to_hf_gpt2(DecoderLM(gpt2_like.config.replace(scale_embeddings=True)))
    for ablation in (
        {"attention.scale": False},
        {"residual": False},
        {"attention.score": "additive"},
    ):
        name = next(iter(ablation))
        with pytest.raises(ValueError, match=name):  # HF would compute something else
            to_hf_gpt2(DecoderLM(gpt2_like.config.replace(**ablation)))
        with pytest.raises(ValueError, match=name):
            to_hf_llama(DecoderLM(llama_like.config.replace(**ablation)))


def test_unused_hf_weight_raises() -> None:
    hf = llama()
    hf.model.layers[0].self_attn.q_proj.bias = nn.Parameter(torch.zeros(64))
    with pytest.raises(ValueError, match=r"q_proj\.bias"):
        from_hf_llama(hf)


# ----- GPT-2 --------------------------------------------------------------------------------


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_gpt2_logits_match(attn: str) -> None:
    hf = gpt2(attn)
    ours = from_hf_gpt2(hf).eval()
    assert isinstance(ours, DecoderLM) and ours.head.weight is ours.embed.token.weight
    ids = torch.randint(0, VOCAB, (3, 20))
    expected = hf_logits(hf, ids)
    torch.testing.assert_close(ours_logits(ours, ids), expected, **TOL)
    torch.testing.assert_close(incremental(ours, ids), expected, **TOL)


def test_gpt2_round_trip() -> None:
    hf = gpt2()
    back = to_hf_gpt2(from_hf_gpt2(hf), attn_implementation="eager").eval()
    assert back.lm_head.weight is back.transformer.wte.weight
    assert_same_state(back.state_dict(), hf.state_dict(), "HF -> aiayn -> HF")
    ids = torch.randint(0, VOCAB, (2, 16))
    torch.testing.assert_close(hf_logits(back, ids), hf_logits(hf, ids), **TOL)


def test_gpt2_untied_and_gelu() -> None:
    hf = gpt2(tie_word_embeddings=False, activation_function="gelu")
    ours = from_hf_gpt2(hf).eval()
    assert not ours.config.tie_embeddings and ours.config.ffn.activation == "gelu"
    ids = torch.randint(0, VOCAB, (2, 10))
    torch.testing.assert_close(ours_logits(ours, ids), hf_logits(hf, ids), **TOL)


def test_gpt2_left_padding() -> None:
    hf = gpt2("sdpa")
    ours = from_hf_gpt2(hf).eval()
    ids, mask = left_padded()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = hf_logits(hf, ids, attention_mask=mask, position_ids=positions)
    got = ours_logits(ours, ids, attention_mask=mask.bool())
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], **TOL)


# ----- Llama --------------------------------------------------------------------------------


@pytest.mark.parametrize(("attn", "theta", "tied"), LLAMAS)
def test_llama_logits_match(attn: str, theta: float, tied: bool) -> None:
    hf = llama(attn, theta, tied)
    ours = from_hf_llama(hf).eval()
    assert (ours.head.weight is ours.embed.token.weight) == tied
    ids = torch.randint(0, VOCAB, (3, 24))
    expected = hf_logits(hf, ids)
    torch.testing.assert_close(ours_logits(ours, ids), expected, **TOL)
    torch.testing.assert_close(incremental(ours, ids), expected, **TOL)


@pytest.mark.parametrize(("attn", "theta", "tied"), LLAMAS)
def test_llama_round_trip(attn: str, theta: float, tied: bool) -> None:
    hf = llama(attn, theta, tied)
    back = to_hf_llama(from_hf_llama(hf), attn_implementation=attn).eval()
    assert back.config.tie_word_embeddings == tied
    assert_same_state(back.state_dict(), hf.state_dict(), "HF -> aiayn -> HF")
    ids = torch.randint(0, VOCAB, (2, 16))
    torch.testing.assert_close(hf_logits(back, ids), hf_logits(hf, ids), **TOL)


def test_llama_linear_rope_scaling() -> None:
    scaling = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    hf = llama(rope_parameters=scaling)
    ours = from_hf_llama(hf).eval()
    assert ours.config.positions.rope_scaling == 2.0
    ids = torch.randint(0, VOCAB, (2, 40))
    torch.testing.assert_close(ours_logits(ours, ids), hf_logits(hf, ids), **TOL)
    back = to_hf_llama(ours, attn_implementation="eager").eval()
    torch.testing.assert_close(hf_logits(back, ids), hf_logits(hf, ids), **TOL)


@pytest.mark.parametrize(("attn", "theta", "tied"), LLAMAS)
def test_llama_left_padding(attn: str, theta: float, tied: bool) -> None:
    hf = llama(attn, theta, tied)
    ours = from_hf_llama(hf).eval()
    ids, mask = left_padded()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = hf_logits(hf, ids, attention_mask=mask, position_ids=positions)
    real = mask.bool()
    got = ours_logits(ours, ids, attention_mask=real)
    torch.testing.assert_close(got[real], expected[real], **TOL)
    # Prefill the padded prompt into the cache, then decode the rest one token at a time.
    prompt = 10
    cache = ours.new_cache(ids.shape[0], ids.shape[1])
    with torch.no_grad():
        steps = [ours(ids[:, :prompt], attention_mask=real[:, :prompt], cache=cache)]
        steps += [ours(ids[:, i : i + 1], cache=cache) for i in range(prompt, ids.shape[1])]
    got = torch.cat(steps, dim=1)
    torch.testing.assert_close(got[real], expected[real], **TOL)


def test_config_round_trip_is_identity() -> None:
    config = config_from_llama(llama(theta=500000.0).config)
    model = DecoderLM(config)
    assert config_from_llama(to_hf_llama(model).config) == config
    config = config_from_gpt2(gpt2().config)
    assert config_from_gpt2(to_hf_gpt2(DecoderLM(config)).config) == config
    assert isinstance(config, ModelConfig)


# ----- Mistral and Qwen2 (the Llama family) -------------------------------------------------


def llama_family(kind: str, attn: str = "eager", **overrides: object) -> nn.Module:
    kwargs: dict = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
    )
    kwargs.update(overrides)
    config = getattr(transformers, f"{kind}Config")(**kwargs, attn_implementation=attn)
    model = getattr(transformers, f"{kind}ForCausalLM")(config).eval()
    with torch.no_grad():  # norms start at 1 and biases at 0: perturb them so they are tested
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_mistral_sliding_window_logits_and_cache_match(attn: str) -> None:
    """A window of 6 on 24 tokens: every later query sees only its last 6 keys, in HF's
    masking as in ours, over a full pass and over cached decoding."""
    hf = llama_family("Mistral", attn, sliding_window=6)
    ours = from_hf(hf).eval()
    assert ours.config.attention.sliding_window == 6
    ids = torch.randint(0, VOCAB, (2, 24))
    expected = hf_logits(hf, ids)
    torch.testing.assert_close(ours_logits(ours, ids), expected, **TOL)
    torch.testing.assert_close(incremental(ours, ids), expected, **TOL)
    back = to_hf_mistral(ours, attn_implementation=attn).eval()
    torch.testing.assert_close(hf_logits(back, ids), expected, **TOL)


@pytest.mark.parametrize("tied", [False, True])
def test_qwen2_biases_logits_and_cache_match(tied: bool) -> None:
    hf = llama_family("Qwen2", tie_word_embeddings=tied)
    ours = from_hf(hf).eval()
    assert ours.config.attention.qkv_bias is True and ours.config.bias is False
    assert ours.decoder.blocks[0].self_attn.out.bias is None  # o_proj has none
    ids = torch.randint(0, VOCAB, (2, 20))
    expected = hf_logits(hf, ids)
    torch.testing.assert_close(ours_logits(ours, ids), expected, **TOL)
    torch.testing.assert_close(incremental(ours, ids), expected, **TOL)
    back = to_hf_qwen2(ours, attn_implementation="eager").eval()
    torch.testing.assert_close(hf_logits(back, ids), expected, **TOL)
    assert back.config.tie_word_embeddings == tied


def test_llama_family_limits_are_named() -> None:
    with pytest.raises(ValueError, match="max_window_layers=1 cannot be converted"):
        from_hf(
            llama_family("Qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
        )
    with pytest.raises(ValueError, match="model_type='bert' cannot be converted"):
        from_hf(
            transformers.BertForMaskedLM(
                transformers.BertConfig(
                    vocab_size=VOCAB,
                    hidden_size=32,
                    num_hidden_layers=1,
                    num_attention_heads=2,
                    intermediate_size=64,
                )
            )
        )
    qwen = from_hf(llama_family("Qwen2"))
    with pytest.raises(ValueError, match="projection_bias=True cannot be converted"):
        to_hf_llama(qwen)
    mistral = from_hf(llama_family("Mistral", sliding_window=6))
    with pytest.raises(ValueError, match="attention.sliding_window=6 cannot be converted"):
        to_hf_llama(mistral)


@pytest.mark.parametrize(("experts", "top_k", "window"), [(4, 2, None), (3, 1, 5)])
def test_mixtral_routing_logits_and_cache_match(
    experts: int, top_k: int, window: int | None
) -> None:
    """Mixtral: HF's router (softmax over all experts, top k, renormalised) and its fused
    experts, logit for logit over a full pass and over cached decoding; round trip exact."""
    from aiayn.interop.llama import to_hf_mixtral

    hf = llama_family(
        "Mixtral",
        "eager",
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        attention={"sliding_window": window},
    )
    with torch.no_grad():  # a router with real preferences, so that routing is exercised
        for layer in hf.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 1.0)
    ours = from_hf(hf).eval()
    assert ours.config.ffn.n_experts == experts and ours.config.ffn.top_k == top_k
    ids = torch.randint(0, VOCAB, (2, 20))
    expected = hf_logits(hf, ids)
    torch.testing.assert_close(ours_logits(ours, ids), expected, **TOL)
    torch.testing.assert_close(incremental(ours, ids), expected, **TOL)
    back = to_hf_mixtral(ours).eval()
    assert_same_state(back.state_dict(), hf.state_dict(), "HF -> aiayn -> HF")
