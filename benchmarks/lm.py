"""Decoder-only LM speed, side by side with peers in one run (fp32, CPU or GPU).

    python benchmarks/lm.py [--threads 2] [--quick] [--no-quality] [--no-train] [--json benchmarks/results/lm.json]

0. Quality: configs/shakespeare_char.toml (nanoGPT's CPU example: 4 layers, 4 heads, 128 wide,
   context 64, batch 12, 2,000 iterations, no dropout) trained from scratch; the validation
   loss (200 batches) and the wall time.  Needs $AIAYN_DATA (or ../shared/data).
1. fp32 matmul rate of this machine (the MFU denominator) and memory read bandwidth.
2. Training: ms per iteration (forward, backward, AdamW) and model-FLOPs utilisation for
   nanoGPT's CPU Shakespeare shape and a 6-layer, 384-wide model, against HF GPT2LMHeadModel
   (SDPA) and x-transformers with the same shape, batch and threads.
3. Generation: tokens/s for 256 new tokens after a 32-token prompt, batch 1 and 8, against HF
   ``generate`` with its cache, using identical weights; time per token at the start and end.

MFU is given against both matmul rates measured in the run: torch.mm's (MKL, what the issue's
baseline measured) and oneDNN's (what aiayn's Linear uses on CPU; on AMD processors it is about
twice MKL's).  It uses the PaLM count: 6·N + 12·L·T·d FLOPs per token for training (N = parameters in the
matrices, output projection included), 2·N + 4·L·S·d per generated token.
Peers are optional: a missing package is reported and skipped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from bench_common import matmul_rates, median_time, timed

import aiayn
from aiayn.config import ModelConfig, get_preset
from aiayn.generate import SamplingConfig, generate
from aiayn.inspect.calc import training_flops_per_token
from aiayn.interop.hf import to_hf_gpt2

SHAPES = {
    "nanogpt-cpu": dict(n_layers=4, n_heads=4, d_model=128, block=64, batch=12, vocab=65),
    "6L-384": dict(n_layers=6, n_heads=6, d_model=384, block=256, batch=8, vocab=65),
}


def read_bandwidth(repeat: int = 15) -> float:
    """GB/s of the fastest of ``repeat`` sums over 512 MiB: the best read rate seen, so the
    bandwidth bound it gives is the strictest this machine supports."""
    x = torch.randn(512 * 1024 * 1024 // 4)
    _, times = timed(lambda: x.sum(), repeat)
    return x.numel() * 4 / min(times) / 1e9


def config(s: dict[str, int]) -> ModelConfig:
    return get_preset(
        "gpt2-small", n_layers=s["n_layers"], n_heads=s["n_heads"], d_model=s["d_model"], d_ff=4 * s["d_model"],
        vocab_size=s["vocab"], max_len=max(s["block"], 320), dropout=0.0, activation="gelu",
    )  # fmt: skip


def train_flops(s: dict[str, int]) -> float:
    """FLOPs of one training step: batch x block tokens at the PaLM count (aiayn calc)."""
    return s["batch"] * s["block"] * training_flops_per_token(config(s), s["block"])


def ours(s: dict[str, int]) -> torch.nn.Module:
    return aiayn.build_model(config(s))


def hf_gpt2(s: dict[str, int]) -> torch.nn.Module:
    """HF GPT2LMHeadModel (SDPA attention) of the same shape, with our initial weights."""
    return to_hf_gpt2(ours(s), attn_implementation="sdpa")  # type: ignore[arg-type]


def x_transformers(s: dict[str, int]) -> torch.nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    return TransformerWrapper(
        num_tokens=s["vocab"], max_seq_len=s["block"], attn_layers=Decoder(dim=s["d_model"], depth=s["n_layers"], heads=s["n_heads"]),
        tie_embedding=True,
    )  # fmt: skip


def bench_train(build: Any, s: dict[str, int], repeat: int) -> float:
    torch.manual_seed(0)
    model = build(s).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randint(0, s["vocab"], (s["batch"], s["block"]))
    y = torch.randint(0, s["vocab"], (s["batch"], s["block"]))

    def step() -> None:
        out = model(x)
        logits = out.logits if hasattr(out, "logits") else out
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return median_time(step, repeat)


def bench_generate(
    model: Any, batch: int, prompt_len: int, new: int, hf: bool
) -> tuple[float, float, float]:
    torch.manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (batch, prompt_len))
    stamps: list[float] = []
    t0 = time.perf_counter()
    if hf:
        with torch.no_grad():
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False, use_cache=True, pad_token_id=0)  # fmt: skip
    else:
        generate(model, prompt.tolist(), max_new_tokens=new, sampling=SamplingConfig(temperature=0),
                 on_token=lambda _: stamps.append(time.perf_counter()))  # fmt: skip
    total = time.perf_counter() - t0
    first = last = float("nan")
    if len(stamps) > 40:
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        first, last = statistics.median(gaps[1:21]), statistics.median(gaps[-20:])
    return batch * new / total, first, last


def quality(threads: int) -> dict[str, Any]:
    """Train configs/shakespeare_char.toml from scratch; validation loss and wall time."""
    import tempfile

    from aiayn.data.files import data_dir
    from aiayn.train.config import load_run_config
    from aiayn.train.lm import train_lm

    config = Path(__file__).resolve().parent.parent / "configs" / "shakespeare_char.toml"
    run = load_run_config(config, {"train.threads": threads})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        result = train_lm(run, out, data_dir(None), progress=False)
    wall = time.perf_counter() - t0
    print(
        f"quality: {config.name}, {run.train.max_steps} steps: validation loss"
        f" {result.val_loss:.4f} (target <= 1.88, nanoGPT's figure) in {wall:.0f} s wall\n"
    )
    return {"val_loss": result.val_loss, "wall_s": wall, "steps": run.train.max_steps}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument("--json", default="benchmarks/results/lm.json")
    ap.add_argument("--no-quality", action="store_true", help="skip the 2,000-step training run")
    ap.add_argument("--no-train", action="store_true", help="skip the training-speed table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    repeat = 3 if args.quick else 10
    results: dict[str, Any] = {"threads": args.threads, "torch": torch.__version__}
    if not args.no_quality:
        results["quality"] = quality(args.threads)
    rate, onednn_rate = matmul_rates()
    bw = read_bandwidth()
    results["matmul_gflops"], results["onednn_gflops"], results["read_gb_s"] = rate, onednn_rate, bw
    print(
        f"fp32 matmul: torch.mm {rate:.0f} GFLOP/s, oneDNN {onednn_rate:.0f} GFLOP/s;"
        f" memory read {bw:.1f} GB/s; {args.threads} threads\n"
    )

    peers = {"aiayn": ours, "hf-gpt2-sdpa": hf_gpt2, "x-transformers": x_transformers}
    print(
        f"{'training':<14}{'model':<16}{'ms/iter':>9}{'MFU(mm)':>9}{'MFU(oneDNN)':>12}{'vs aiayn':>10}"
    )
    results["train"] = {}
    for shape, s in {} if args.no_train else SHAPES.items():
        row: dict[str, Any] = {}
        for name, build in peers.items():
            try:
                sec = bench_train(build, s, repeat)
            except ImportError as err:
                print(f"{shape:<14}{name:<16} skipped: {err}")
                continue
            mfu = train_flops(s) / sec / (rate * 1e9)
            mfu_onednn = train_flops(s) / sec / (onednn_rate * 1e9)
            row[name] = {"ms_per_iter": sec * 1e3, "mfu": mfu, "mfu_onednn": mfu_onednn}
        for name, r in row.items():
            ratio = r["ms_per_iter"] / row["aiayn"]["ms_per_iter"]
            print(
                f"{shape:<14}{name:<16}{r['ms_per_iter']:>9.1f}{r['mfu']:>9.1%}{r['mfu_onednn']:>12.1%}{ratio:>9.2f}x"
            )
        results["train"][shape] = row

    print(
        f"\n{'generation':<14}{'batch':>6}{'aiayn tok/s':>13}{'HF tok/s':>10}{'ratio':>7}{'ms/tok start':>14}{'end':>7}"
    )
    results["generate"] = {}
    gen_shapes = {
        "6L-384": SHAPES["6L-384"],
        "gpt2-small-shape": dict(
            n_layers=12, n_heads=12, d_model=768, block=320, batch=1, vocab=50257
        ),
    }
    for shape, s in gen_shapes.items():
        torch.manual_seed(0)
        model = ours(s).eval()
        hf = to_hf_gpt2(model, attn_implementation="sdpa").eval()
        weight_bytes = sum(p.numel() * 4 for p in model.parameters())
        shape_bw = max(bw, read_bandwidth())  # measured again next to this shape's runs
        bound = shape_bw * 1e9 / weight_bytes  # tokens/s if every weight is read once per step
        for batch in (1, 8):
            ours_tps, first, last = bench_generate(model, batch, 32, 256, hf=False)
            if batch == 1:
                ours_b1 = ours_tps
            hf_tps, _, _ = bench_generate(hf, batch, 32, 256, hf=True)
            print(
                f"{shape:<14}{batch:>6}{ours_tps:>13.0f}{hf_tps:>10.0f}{ours_tps / hf_tps:>6.2f}x{first * 1e3:>14.2f}{last * 1e3:>7.2f}"
            )
            results["generate"][f"{shape}/b{batch}"] = {
                "aiayn_tok_s": ours_tps, "hf_tok_s": hf_tps, "ratio": ours_tps / hf_tps,
                "ms_per_token_start": first * 1e3, "ms_per_token_end": last * 1e3,
                "bandwidth_bound_tok_s": bound * batch, "fraction_of_bound": ours_tps / (bound * batch),
            }  # fmt: skip
        print(
            f"{'':<14}weights {weight_bytes / 1e6:.0f} MB; read bandwidth {shape_bw:.1f} GB/s;"
            f" bound {bound:.0f} steps/s; batch 1 at {ours_b1 / bound:.0%} of it"
        )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
