"""The device check: what anyone with a GPU runs to see aiayn's GPU paths work and how fast.

    python benchmarks/gpu_check.py [--device cuda] [--steps 1500] [--quick] [--json ...]

Writes JSON and prints a table.  It covers:

1. ``pytest -m cuda``: the tests that need a GPU (tiled attention on CUDA, bf16 training with
   everything on the device, bf16 generation and beam search).
2. The paper's base model (6+6 layers, 512 wide, 8 heads, d_ff 2048) trained on Multi30k
   de->en for a fixed number of steps in bf16: target tokens/s, model-FLOPs utilisation
   against the GPU's bf16 matmul rate measured in the same run, peak GPU memory, and
   sacreBLEU on test_2016_flickr (beam 4) -- plus the same training step for
   torch.nn.Transformer and HF Marian at the same shape and batch, in the same run.
3. Generation of the GPT-2-small shape at batch 1, 8 and 64 against HF ``generate`` (bf16,
   greedy, 32 prompt tokens, 128 new), and beam search (beam 4) against HF Marian.

``--device cpu --quick`` runs every part on a tiny scale: the script's own smoke test.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import aiayn
from aiayn.checkpoint import load
from aiayn.data.files import data_dir
from aiayn.data.parallel import multi30k
from aiayn.device import matmul_gflops, resolve_device
from aiayn.evaluation.translation import score
from aiayn.generate import SamplingConfig, generate
from aiayn.generate.beam import BeamConfig, beam_search
from aiayn.generate.translate import translate
from aiayn.training.config import load_run_config
from aiayn.training.translate import train_translation

ROOT = Path(__file__).resolve().parent.parent


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Any, device: torch.device, repeat: int) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def cuda_tests() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "cuda", str(ROOT / "tests")],
        capture_output=True,
        text=True,
        check=False,
    )
    return {"returncode": done.returncode, "summary": done.stdout.strip().splitlines()[-1:]}


def paper_base_training(
    device: torch.device, steps: int, quick: bool, rate: float
) -> dict[str, Any]:
    """Train paper-base on Multi30k in bf16 for ``steps`` steps; speed, MFU, memory, BLEU."""
    overrides: dict[str, Any] = {
        "train.device": str(device),
        "train.dtype": "bfloat16" if device.type == "cuda" else "float32",
        "train.max_steps": steps,
        "train.warmup_steps": max(1, steps // 10),
        "train.max_tokens": 8192 if not quick else 512,
        "train.eval_interval": steps,
        "train.checkpoint_interval": steps,
        "model.n_layers": 6 if not quick else 1,
        "model.d_model": 512 if not quick else 64,
        "model.attention.n_heads": 8 if not quick else 4,
        "model.ffn.d_ff": 2048 if not quick else 128,
        "model.dropout": 0.3,
        "data.bpe_vocab_size": 8000 if not quick else 500,
    }
    run = load_run_config(ROOT / "configs" / "multi30k_de_en.toml", overrides)
    root = data_dir(None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        result = train_translation(run, out, root, progress=False)
        seconds = time.perf_counter() - t0
        bundle = load(result.checkpoint)
    model = bundle.model.to(device).eval()
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    test = multi30k(root / "multi30k", "test_2016_flickr", "de", "en")[: 100 if quick else None]
    hyps = translate(model, bundle.tokenizer, [p.source for p in test], beam=BeamConfig())  # type: ignore[arg-type]
    c = model.config
    per_token = (
        6 * (c.n_layers * 12 + c.decoder_layers * 16) * c.d_model**2 + 6 * c.d_model * c.vocab_size
    )
    mfu = (
        result.tokens_per_s * 2 * per_token / (rate * 1e9)
    )  # about as many source as target tokens
    return {
        "steps": result.step,
        "seconds": seconds,
        "target_tokens_per_s": result.tokens_per_s,
        "mfu_bf16": mfu,
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30
        if device.type == "cuda"
        else None,
        "val_loss": result.val_loss,
        "bleu": score(hyps, [p.target for p in test]).bleu,
    }


def peer_training(device: torch.device, quick: bool) -> dict[str, float]:
    """One training step at the paper-base shape: aiayn, torch.nn.Transformer, HF Marian."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import translation_speed as ts

    d, layers, ff, heads = (64, 1, 128, 4) if quick else (512, 6, 2048, 8)
    ts.D, ts.LAYERS, ts.FF, ts.H = d, layers, ff, heads
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, ts.V, (128, 32), generator=g).to(device)
    tgt = torch.randint(3, ts.V, (128, 33), generator=g).to(device)
    out = {}
    for name, build, kind in (
        ("aiayn", ts.ours, "aiayn"),
        ("torch.nn.Transformer", ts.TorchTransformer, "torch"),
        ("hf-marian", ts.marian, "marian"),
    ):
        try:
            model = build().to(device).train()
        except ImportError as err:
            out[name] = math.nan
            print(f"  {name}: skipped ({err})")
            continue
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")

        def step(model: Any = model, kind: str = kind, opt: Any = opt) -> None:
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                if kind == "aiayn":
                    loss = model(src, tgt[:, :-1], targets=tgt[:, 1:], label_smoothing=0.1)
                else:
                    logits = (
                        model(input_ids=src, decoder_input_ids=tgt[:, :-1]).logits
                        if kind == "marian"
                        else model(src, tgt[:, :-1])
                    )
                    loss = F.cross_entropy(
                        logits.flatten(0, 1).float(), tgt[:, 1:].flatten(), label_smoothing=0.1
                    )
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        out[name] = 128 * 32 / timed(step, device, 3 if quick else 20)
    return out


def generation(device: torch.device, quick: bool) -> dict[str, dict[str, float]]:
    """GPT-2-small shape, greedy, 32 + 128 tokens: aiayn against HF generate."""
    from aiayn.interop.gpt2 import to_hf_gpt2

    kw = {"n_layers": 2, "d_model": 64, "attention.n_heads": 4, "ffn.d_ff": 256} if quick else {}
    torch.manual_seed(0)
    ours = aiayn.build_model("gpt2-small", dropout=0.0, **kw).to(device).eval()
    hf = to_hf_gpt2(ours).to(device).eval()  # type: ignore[arg-type]
    if device.type == "cuda":
        ours, hf = ours.to(torch.bfloat16), hf.to(torch.bfloat16)
    new = 16 if quick else 128
    rows: dict[str, dict[str, float]] = {}
    greedy = SamplingConfig(temperature=0)
    for batch in (1, 8, 64):
        prompt = torch.randint(0, ours.config.vocab_size, (batch, 32), device=device)
        a = timed(
            lambda p=prompt: generate(ours, p.tolist(), max_new_tokens=new, sampling=greedy),
            device,
            2,
        )

        def hf_generate(p: torch.Tensor = prompt) -> Any:
            with torch.no_grad():
                return hf.generate(
                    p,
                    attention_mask=torch.ones_like(p),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    pad_token_id=0,
                )

        b = timed(hf_generate, device, 2)
        rows[f"b{batch}"] = {"aiayn_tok_s": batch * new / a, "hf_tok_s": batch * new / b}
    return rows


def beams(device: torch.device, quick: bool) -> dict[str, float]:
    """Beam 4 on 64 random sources: aiayn against HF Marian's generate(num_beams=4)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import translation_speed as ts

    torch.manual_seed(0)
    ours = ts.ours().to(device).eval()
    src = torch.randint(3, ts.V, (64, 20), device=device)
    cfg = BeamConfig(max_extra=20)
    a = timed(lambda: beam_search(ours, src, bos=1, eos=2, config=cfg), device, 2)
    try:
        marian = ts.marian().to(device).eval()
    except ImportError:
        return {"aiayn_sent_s": 64 / a}
    with torch.no_grad():
        b = timed(
            lambda: marian.generate(src, num_beams=4, max_new_tokens=40, length_penalty=0.6),
            device,
            2,
        )
    return {"aiayn_sent_s": 64 / a, "hf_marian_sent_s": 64 / b}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script")
    ap.add_argument(
        "--json", default=str(Path(__file__).resolve().parent / "results" / "gpu_check.json")
    )
    args = ap.parse_args()
    device = resolve_device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rate = matmul_gflops(1024 if args.quick else 8192, dtype, device=str(device))
    print(f"{name}: {str(dtype).removeprefix('torch.')} matmul {rate:,.0f} GFLOP/s")
    report: dict[str, Any] = {"device": name, "matmul_gflops": rate}
    if device.type == "cuda":
        report["cuda_tests"] = cuda_tests()
        print(f"pytest -m cuda: {report['cuda_tests']['summary']}")
    report["paper_base"] = paper_base_training(device, args.steps, args.quick, rate)
    print(f"paper-base on Multi30k: {report['paper_base']}")
    report["train_step_tokens_per_s"] = peer_training(device, args.quick)
    print(f"training step, target tokens/s: {report['train_step_tokens_per_s']}")
    report["generation"] = generation(device, args.quick)
    print(f"generation: {report['generation']}")
    report["beam_search"] = beams(device, args.quick)
    print(f"beam search: {report['beam_search']}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
