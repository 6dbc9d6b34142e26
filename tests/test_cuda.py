"""GPU paths, run where a GPU is (``pytest -m cuda``; skipped elsewhere): the tiled kernel on
CUDA, training in bf16 with the model, batches and optimizer state on the GPU, and generation
and beam search in bf16 with a bf16 KV cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import aiayn
from aiayn.generate import SamplingConfig, generate
from aiayn.generate.beam import BeamConfig, beam_search
from aiayn.nn.attention import scaled_dot_product_attention

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_attention_on_cuda_equals_sdpa(causal: bool) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 700, 64, device="cuda", requires_grad=True) for _ in range(3))
    ref = scaled_dot_product_attention(q, k, v, is_causal=causal, backend="sdpa")
    out = scaled_dot_product_attention(q, k, v, is_causal=causal, backend="flash")
    # fp32, tiles vs one pass over 700 keys: 64-term dots x 2^-23 ~ 8e-6; same test on CPU: 1.2e-6
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    g = torch.randn_like(out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    grads = torch.autograd.grad(out, (q, k, v), g)
    for a, b in zip(grads, ref_grads, strict=True):
        # grads sum over all 700 rows as well: 5x / 10x the forward's room; CPU: 2.3e-6
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_training_on_the_gpu_in_bf16_and_resuming_on_the_cpu(tmp_path: Path) -> None:
    from aiayn.checkpoint import RunDir
    from aiayn.training.config import load_run_config
    from aiayn.training.lm import train_lm
    from tests.conftest import LM_TEXT, LM_TOML

    (tmp_path / "corpus.txt").write_text(LM_TEXT)
    (tmp_path / "run.toml").write_text(LM_TOML)
    run = load_run_config(
        tmp_path / "run.toml", {"train.device": "cuda", "train.dtype": "bfloat16"}
    )
    result = train_lm(run, tmp_path / "gpu", tmp_path, stop_after=4, progress=False)
    assert result.step == 4
    bundle, state = RunDir(tmp_path / "gpu").load()  # written from the GPU, read on the CPU
    assert next(bundle.model.parameters()).device.type == "cpu" and state.cuda_rng
    cpu = load_run_config(tmp_path / "run.toml", {"train.device": "cpu"})
    done = train_lm(cpu, tmp_path / "gpu", tmp_path, resume=True, progress=False)
    assert done.step == 8


def test_generation_and_beam_search_in_bf16() -> None:
    torch.manual_seed(0)
    kw = {
        "n_layers": 2,
        "d_model": 64,
        "attention.n_heads": 4,
        "ffn.d_ff": 128,
        "vocab_size": 50,
        "dropout": 0.0,
        "max_len": 64,
    }
    lm = aiayn.build_model("gpt2-small", **kw).cuda().to(torch.bfloat16).eval()
    assert lm.new_cache(2).layers[0].self_kv.k.dtype == torch.bfloat16
    out = generate(
        lm, [[1, 2, 3], [4, 5]], max_new_tokens=10, sampling=SamplingConfig(temperature=0)
    )
    assert len(out) == 2 and all(len(o) == 10 for o in out)
    mt = aiayn.build_model("paper-base", **kw).cuda().to(torch.bfloat16).eval()
    src = torch.randint(3, 50, (3, 7), device="cuda")
    hyps = beam_search(mt, src, bos=1, eos=2, config=BeamConfig(max_extra=5))
    assert len(hyps) == 3
