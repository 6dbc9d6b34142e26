from __future__ import annotations

import itertools
import json

import pytest
import torch

import aiayn
from aiayn.cli import main
from aiayn.config import ModelConfig, get_preset
from aiayn.inspect.calc import (
    attention_score_bytes,
    dtype_size,
    forward_flops_per_token,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    matmul_parameters,
    parameter_breakdown,
    parameter_count,
    training_flops_per_token,
)
from aiayn.inspect.cost_report import cost_report, format_bytes, format_cost_report
from aiayn.models.precision import Precision, apply_precision

LLAMA3_70B = 70_553_706_496  # Meta's published count for Llama-3-70B


def _built(config: ModelConfig) -> int:
    with torch.device("meta"):
        return aiayn.build_model(config).num_parameters()


@pytest.mark.parametrize("name", aiayn.presets())
def test_parameter_count_matches_every_preset(name: str) -> None:
    config = get_preset(name)
    n = parameter_count(config)
    assert n == parameter_breakdown(config).total
    if name == "llama3-70b":
        assert n == LLAMA3_70B
    else:
        assert n == _built(config)


def _variants() -> list[ModelConfig]:
    small = {"vocab_size": 61, "n_layers": 2, "d_model": 16, "attention.n_heads": 4, "ffn.d_ff": 24}
    out = []
    for arch, positional, activation, bias, tie, norm, where in itertools.product(
        ("encoder-decoder", "decoder", "encoder"),
        ("sinusoidal", "learned", "rope", "none"),
        ("gelu", "swiglu"),
        (True, False),
        (True, False),
        ("layernorm", "rmsnorm"),
        ("pre", "post"),
    ):
        out.append(
            ModelConfig.from_dict(
                {
                    "arch": arch,
                    "positions.scheme": positional,
                    "ffn.activation": activation,
                    "bias": bias,
                    "tie_embeddings": tie,
                    "norm": norm,
                    "norm_position": where,
                    "max_len": 32,
                    **small,
                }
            )
        )
    base = ModelConfig.from_dict(dict(max_len=32, **small))
    out += [
        base.replace(attention={"n_kv_heads": 2}),
        base.replace(attention={"n_kv_heads": 1, "d_head": 6}, positions={"scheme": "rope"}),
        base.replace(attention={"d_head": 5}),
        base.replace(n_decoder_layers=3),
        base.replace(src_vocab_size=47, tie_embeddings=False),
        base.replace(src_vocab_size=47, tie_embeddings=False, positions={"scheme": "learned"}),
        base.replace(
            arch="decoder",
            attention={"n_kv_heads": 2, "d_head": 8},
            ffn={"activation": "swiglu"},
            bias=False,
        ),
        base.replace(
            arch="encoder",
            attention={"n_kv_heads": 1, "d_head": 3},
            ffn={"activation": "gelu_tanh"},
        ),
        base.replace(ffn={"n_experts": 4, "top_k": 2}),  # mixture of experts (aiayn/nn/moe.py)
        base.replace(arch="decoder", ffn={"n_experts": 3, "top_k": 1, "activation": "swiglu"}),
        base.replace(
            attention={"score": "additive", "n_kv_heads": 2}
        ),  # one w per head and sublayer
        base.replace(arch="decoder", attention={"score": "additive"}, residual=False),
        base.replace(arch="decoder", mixer={"kind": "linear", "attention_every": 2}),
        base.replace(arch="decoder", bias=False, attention={"qkv_bias": True}),  # Qwen2's biases
        base.replace(attention={"qkv_bias": False}),
        base.replace(arch="encoder", type_vocab_size=2, embedding_norm=True, pooler=True),
        base.replace(arch="encoder", pooler=True, mlm_head=False, tie_embeddings=False),
        base.replace(embedding_norm=True, positions={"scheme": "learned"}),  # two stacks, two norms
        base.replace(head_bias=True, ffn={"activation": "silu"}),  # Marian's logits bias, SiLU FFN
        base.replace(arch="decoder", head_bias=True, tie_embeddings=False),
        base.replace(
            arch="decoder", mixer={"kind": "ssm", "ssm_head_dim": 8}, bias=False
        ),  # aiayn/nn/ssm.py
        base.replace(
            arch="decoder",
            mixer={
                "kind": "ssm",
                "attention_every": 2,
                "ssm_state": 4,
                "ssm_expand": 1,
                "ssm_head_dim": 16,
            },
        ),
    ]
    return out


@pytest.mark.slow
def test_parameter_count_matches_built_variants() -> None:
    for config in _variants():
        assert parameter_count(config) == _built(config), config


def test_llama3_70b_kv_cache() -> None:
    config = get_preset("llama3-70b")
    assert kv_cache_bytes_per_token(config, "bf16") == 320 * 1024
    assert kv_cache_bytes(config, 8192, dtype_bytes="bf16") == 320 * 1024 * 8192  # 2.5 GiB
    assert kv_cache_bytes_per_token(config, "float32") == 640 * 1024
    assert format_bytes(kv_cache_bytes_per_token(config, 2)) == "320 KiB"


def test_kv_cache_scales_with_context_and_window() -> None:
    config = get_preset("llama-style-small")
    per_token = kv_cache_bytes_per_token(config, 2)
    assert kv_cache_bytes(config, 1000, batch=3, dtype_bytes=2) == per_token * 1000 * 3
    windowed = config.replace(attention={"sliding_window": 256})
    assert kv_cache_bytes(windowed, 1000, dtype_bytes=2) == per_token * 256
    assert kv_cache_bytes(windowed, 100, dtype_bytes=2) == per_token * 100
    assert kv_cache_bytes_per_token(get_preset("bert-base")) == 0


@pytest.mark.parametrize(
    ("overrides", "dtype"),
    [
        ({}, torch.float32),
        ({}, torch.bfloat16),
        ({"attention.sliding_window": 5}, torch.float32),
        ({"arch": "encoder-decoder", "n_decoder_layers": 3, "tie_embeddings": True}, torch.float32),
    ],
)
def test_kv_cache_bytes_equal_a_real_cache(overrides: dict, dtype: torch.dtype) -> None:
    config = ModelConfig.from_dict(
        {
            "arch": "decoder",
            "vocab_size": 50,
            "n_layers": 2,
            "d_model": 32,
            "attention.n_heads": 4,
            "attention.n_kv_heads": 2,
            "ffn.d_ff": 48,
            "max_len": 16,
            "positions.scheme": "rope",
            "tie_embeddings": False,
            "pad_id": None,
        }
    ).replace(**overrides)
    model = aiayn.build_model(config)
    batch, capacity = 3, 12
    cache = model.new_cache(batch, capacity, dtype=dtype)  # type: ignore[operator]
    names = {torch.float32: "float32", torch.bfloat16: "bf16"}
    assert cache.nbytes() == kv_cache_bytes(config, capacity, batch, names[dtype])


def test_gqa_shrinks_kv_cache_by_the_group_size() -> None:
    mha = get_preset("gpt2-small", attention={"n_kv_heads": None})
    for kv in (1, 3, 4, 6):
        gqa = mha.replace(attention={"n_kv_heads": kv})
        assert kv_cache_bytes_per_token(mha) == kv_cache_bytes_per_token(gqa) * (12 // kv)


def test_training_flops_by_hand() -> None:
    # Decoder: 2 layers, d=16, 4 heads of 4, 2 KV heads, d_ff 24 (GELU), vocab 61, tied.
    config = ModelConfig.from_dict(
        {
            "arch": "decoder",
            "vocab_size": 61,
            "n_layers": 2,
            "d_model": 16,
            "attention.n_heads": 4,
            "attention.n_kv_heads": 2,
            "ffn.d_ff": 24,
            "max_len": 64,
            "positions.scheme": "learned",
            "ffn.activation": "gelu",
            "pad_id": None,
        }
    )
    attn = 16 * (16 + 2 * 8) + 16 * 16  # qkv + out
    ffn = 16 * 24 + 24 * 16
    n_matmul = 2 * (attn + ffn) + 61 * 16  # output projection counted although tied
    assert matmul_parameters(config) == n_matmul
    t = 50
    expected = 6 * n_matmul + 12 * 2 * t * 16
    assert training_flops_per_token(config, t) == expected
    assert forward_flops_per_token(config, t) * 3 == expected
    # A sliding window limits the keys each query sees.
    windowed = config.replace(attention={"sliding_window": 10})
    assert training_flops_per_token(windowed, t) == 6 * n_matmul + 12 * 2 * 10 * 16
    # Encoder-decoder: encoder self + decoder self + cross attention, equal lengths.
    ed = config.replace(arch="encoder-decoder", n_decoder_layers=3, pad_id=0)
    n_ed = 2 * (attn + ffn) + 3 * (2 * attn + ffn) + 61 * 16
    assert training_flops_per_token(ed, t) == 6 * n_ed + 12 * (2 + 3 * 2) * t * 16


def test_moe_counts_active_parameters_in_flops() -> None:
    dense = get_preset("gpt2-small", n_layers=2)
    moe = dense.replace(ffn={"n_experts": 8, "top_k": 2})
    ffn = 2 * 768 * 3072  # W1 and W2 of one expert
    assert matmul_parameters(moe) - matmul_parameters(dense) == 2 * (ffn + 768 * 8)
    assert parameter_count(moe) - parameter_count(dense) == 2 * (7 * (ffn + 3072 + 768) + 768 * 8)


def test_attention_score_bytes() -> None:
    config = get_preset("gpt2-small")
    assert attention_score_bytes(config, 1024, batch=2, dtype_bytes="fp32") == 2 * 12 * 1024**2 * 4


def test_bad_dtype_and_sizes_raise() -> None:
    assert (dtype_size("BF16"), dtype_size("fp8"), dtype_size("float32")) == (2, 1, 4)
    with pytest.raises(ValueError, match=r"'fp64'.*bf16"):
        dtype_size("fp64")
    with pytest.raises(ValueError, match="'double'"):
        cost_report(get_preset("gpt2-small"), 128, dtype="double")
    with pytest.raises(ValueError, match="context=0"):
        kv_cache_bytes(get_preset("gpt2-small"), 0)


def test_report_text() -> None:
    report = cost_report(get_preset("llama3-70b"), 8192, name="llama3-70b")
    assert report.parameters == LLAMA3_70B
    text = format_cost_report(report)
    assert "70.55B" in text and "320 KiB" in text and "2.5 GiB" in text


def test_cli_calc(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    assert main(["calc", "llama3-70b", "--context", "8192"]) == 0
    out = capsys.readouterr().out
    assert "320" in out and "KiB" in out
    assert main(["calc", "llama3-70b", "--context", "8192", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"] == LLAMA3_70B
    assert data["kv_cache_bytes_per_token"] == 320 * 1024
    assert data["kv_cache_bytes"] == 320 * 1024 * 8192
    path = tmp_path / "small.json"
    path.write_text(get_preset("gpt2-small", n_layers=2).to_json())
    assert main(["calc", str(path), "--set", "n_layers=3", "--dtype", "fp32", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"] == parameter_count(get_preset("gpt2-small", n_layers=3))
    assert main(["calc", "no-such-model"]) == 2
    assert "neither a preset" in capsys.readouterr().err


def test_decoding_bytes_per_token_are_the_weights_and_the_cache_a_step_reads() -> None:
    """Counted against the tensors of a built model: the decoding step's linear weights (the
    decoder's and the output projection; an encoder-decoder's encoder is not read per token)
    in each precision, and the cached keys and values of ``context`` tokens."""
    from aiayn.inspect.calc import decoding_bytes_per_token
    from aiayn.nn.linear import Linear

    for preset in ("gpt2-small", "paper-base"):
        model = aiayn.build_model(
            preset,
            n_layers=2,
            d_model=64,
            attention={"n_heads": 4},
            ffn={"d_ff": 256},
            vocab_size=500,
            max_len=64,
        )
        skip = "encoder." if preset == "paper-base" else "\0"
        linears = [
            m for n, m in model.named_modules() if isinstance(m, Linear) and not n.startswith(skip)
        ]
        weights = sum(m.weight.numel() for m in linears)
        cache = model.new_cache(1, 64)
        kv_fp32 = cache.nbytes() // 64  # per position
        cross = 16 if preset == "paper-base" else 0  # the source's keys and values
        c = model.config
        assert decoding_bytes_per_token(c, 16, "float32") == 4 * weights + kv_fp32 * (16 + cross)
        assert decoding_bytes_per_token(c, 16, "bfloat16") == 2 * weights + kv_fp32 // 2 * (
            16 + cross
        )
        rows = sum(m.out_features for m in linears)  # one fp32 scale each in int8
        got = decoding_bytes_per_token(c, 16, "int8") - kv_fp32 * (16 + cross)
        assert weights + 4 * rows <= got <= weights + 4 * weights // c.d_model
        # int8 weights and a bf16 cache, counted on the model so set: its own keys and values
        # in the cache's dtype, an encoder-decoder's cross-attention ones as it keeps them
        int8 = apply_precision(model, torch.device("cpu"), Precision("float32", "int8", "bfloat16"))
        cache = int8.new_cache(1, 64)
        kv_self = cache.nbytes() // 64
        if cross:
            with torch.no_grad():
                memory, keep = int8.encode(torch.ones(1, cross, dtype=torch.long))
                int8.decode(torch.ones(1, 1, dtype=torch.long), memory, keep, cache=cache)
            kv_cross = sum(t.nbytes for layer in cache.layers for t in layer.cross_kv or ())
        else:
            kv_cross = 0
        got = decoding_bytes_per_token(c, 16, "int8 + bf16 KV cache") - kv_self * 16 - kv_cross
        assert weights + 4 * rows <= got <= weights + 4 * weights // c.d_model
    with pytest.raises(ValueError, match="precision 'fp8' is invalid"):
        decoding_bytes_per_token(get_preset("gpt2-small"), 16, "fp8")
