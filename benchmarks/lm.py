"""Decoder-only LM speed against peers: every measurement in a fresh process, the
implementations interleaved round by round, medians with min-max (benchmarks/rounds.py).

    python benchmarks/lm.py [--dtype float32|bfloat16] [--rounds 3] [--threads 2] [--quick]
                            [--compile]
                            [--no-quality] [--no-train] [--no-generate] [--json ...]

0. Quality: configs/shakespeare_char.toml (nanoGPT's CPU example: 4 layers, 4 heads, 128 wide,
   context 64, batch 12, 2,000 iterations, no dropout) trained from scratch in the chosen
   dtype; the validation loss (200 batches) and the wall time.  Needs $AIAYN_DATA.
1. Training: ms per iteration (forward, loss, backward, AdamW) for nanoGPT's CPU Shakespeare
   shape and a 6-layer, 384-wide model, against HF GPT2LMHeadModel (SDPA) and x-transformers
   (``attn_dim_head = d_model / heads``) of the same shape.  Same batch, threads, dtype (bf16
   autocast with ``--dtype bfloat16``), warm-up, repeats, no dropout, and the same optimizer
   (``torch.optim.AdamW(fused=True)``).  aiayn runs its trainer's path: the fused
   cross-entropy (``model(x, targets=y)``) and, in fp32, oneDNN linears only if they measure
   faster than MKL on this host at this shape (the probe the trainer runs); in fp32 the row
   "aiayn-mkl" forces MKL, to show how much of the result is the host's oneDNN.  With
   ``--compile``, every implementation also runs under ``torch.compile`` (rows "+compile";
   the compilation happens in the untimed warm-up steps).
2. Generation: tokens/s for 256 new tokens after a 32-token prompt, greedy, batch 1 and 8,
   against HF ``generate`` with its cache, on identical weights (bf16 weights for both with
   ``--dtype bfloat16``).

MFU uses the PaLM count (6·N + 12·L·T·d FLOPs per training token) against torch.mm's rate in
the same dtype.  The host's fp32 and bf16 matmul rates and oneDNN/MKL ratio are printed
before and after.  Peers are optional: a missing package is reported and skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from engines import (
    ct2_engine,
    ct2_folder,
    ct2_impls,
    ct2_tokens,
    engine_rows,
    engine_threads,
    gpt2_folder,
)
from rounds import cell, child_main, host_rates, interleaved, rates_line, spread

import aiayn
from aiayn.config import ModelConfig, get_preset
from aiayn.device import cpu_has_bf16
from aiayn.generate import SamplingConfig, generate
from aiayn.inspect.calc import training_flops_per_token
from aiayn.interop.gpt2 import to_hf_gpt2
from aiayn.models.precision import Precision, apply_precision

ENGINE_ROOT = Path(__file__).resolve().parent / ".engines"  # the HF folders all engines read
SHAPES = {
    "nanogpt-cpu": {
        "n_layers": 4,
        "attention.n_heads": 4,
        "d_model": 128,
        "block": 64,
        "batch": 12,
        "vocab": 65,
    },
    "6L-384": {
        "n_layers": 6,
        "attention.n_heads": 6,
        "d_model": 384,
        "block": 256,
        "batch": 8,
        "vocab": 65,
    },
}


def config(s: dict[str, int]) -> ModelConfig:
    return get_preset(
        "gpt2-small",
        n_layers=s["n_layers"],
        attention={"n_heads": s["n_heads"]},
        d_model=s["d_model"],
        ffn={"d_ff": 4 * s["d_model"], "activation": "gelu"},
        vocab_size=s["vocab"],
        max_len=max(s["block"], 320),
        dropout=0.0,
    )


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
        num_tokens=s["vocab"],
        max_seq_len=s["block"],
        attn_layers=Decoder(
            dim=s["d_model"],
            depth=s["n_layers"],
            heads=s["n_heads"],
            attn_dim_head=s["d_model"] // s["n_heads"],
            attn_flash=True,
        ),
        tie_embedding=True,
    )


BUILD = {"aiayn": ours, "hf-gpt2-sdpa": hf_gpt2, "x-transformers": x_transformers}
# aiayn with MKL's linears forced (no oneDNN): how much of its fp32 lead is this host's oneDNN.
VARIANTS = {"aiayn-mkl": ours}
# --compile adds every implementation again under torch.compile (the whole model, as
# ``train.compile = true`` does; aiayn's compiled linears are F.linear's).
COMPILED = "+compile"
GEN_SHAPES = {
    "6L-384": SHAPES["6L-384"],
    "gpt2-small-shape": {
        "n_layers": 12,
        "attention.n_heads": 12,
        "d_model": 768,
        "block": 320,
        "batch": 1,
        "vocab": 50257,
    },
}


def measure_train(case: dict[str, Any]) -> dict[str, float]:
    """Median seconds of one training iteration, after two untimed ones."""
    from bench_common import median_time

    from aiayn.nn.cpu_kernels import choose_training_kernel, for_training

    s, impl = SHAPES[case["shape"]], case["impl"]
    base = impl.removesuffix(COMPILED)
    torch.manual_seed(0)
    model = {**BUILD, **VARIANTS}[base](s).train()
    forward = torch.compile(model) if impl.endswith(COMPILED) else model  # compiled in warm-up
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randint(0, s["vocab"], (s["batch"], s["block"]))
    y = torch.randint(0, s["vocab"], (s["batch"], s["block"]))
    fp32 = case["dtype"] == "float32"
    rows = s["batch"] * s["block"]
    kernel = (
        choose_training_kernel("auto", rows, s["d_model"], fp32)[0] if impl == "aiayn" else "mkl"
    )

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=not fp32):
            if impl.startswith("aiayn"):
                loss = forward(x, targets=y)
            else:
                out = forward(x)
                logits = out.logits if hasattr(out, "logits") else out
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with for_training(model, kernel):  # as the trainer does (the bf16 row padding too)
        return {"s": median_time(step, case["repeat"]), "onednn": float(kernel == "onednn")}


def _gen_folder(shape: str) -> Path:
    """The one Hugging Face folder every engine decodes (benchmarks/engines.py)."""
    s = GEN_SHAPES[shape]
    hf = {
        "n_layer": s["n_layers"],
        "n_embd": s["d_model"],
        "n_head": s["n_heads"],
        "vocab_size": s["vocab"],
        "n_positions": max(s["block"], 320),
    }
    return gpt2_folder(ENGINE_ROOT, hf)


def _prompt(case: dict[str, Any]) -> torch.Tensor:
    v = GEN_SHAPES[case["shape"]]["vocab"]
    return torch.randint(0, v - 1, (case["batch"], 32), generator=torch.Generator().manual_seed(1))


def _ct2_runner(case: dict[str, Any], folder: Path) -> Any:
    """Greedy generation by CTranslate2 (its converter's model of ``folder``), at fp32 or
    int8, on the torch thread count or one (``-1t``, benchmarks/engines.py); returns the new
    ids."""
    ct2 = ct2_folder(folder)
    tokens = ct2_tokens(ct2)
    index = {t: i for i, t in enumerate(tokens)}
    gen = ct2_engine("generator", ct2, case["impl"], case["threads"])
    start = [[tokens[i] for i in row] for row in _prompt(case).tolist()]

    def run(new: int) -> list[list[int]]:
        out = gen.generate_batch(
            start, max_length=new, min_length=new, sampling_topk=1, include_prompt_in_result=False
        )
        return [[index[t] for t in r.sequences[0]] for r in out]

    return run


def measure_generate(case: dict[str, Any]) -> dict[str, Any]:
    """Tokens/s of one greedy generation of ``new`` tokens after a 32-token prompt, after a
    16-token warm-up generation; and the ids generated.  Every engine reads one HF folder:
    aiayn (fp32, int8 weights, or bf16), HF ``generate`` and CTranslate2 (fp32 or int8)."""
    impl, folder = case["impl"], _gen_folder(case["shape"])
    prompt = _prompt(case)
    if impl.startswith("ct2-"):
        run = _ct2_runner(case, folder)
    elif impl == "hf":
        from transformers import GPT2LMHeadModel

        model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="sdpa").eval()
        if case["dtype"] == "bfloat16":
            model = model.to(torch.bfloat16)

        def run(new: int) -> list[list[int]]:
            with torch.no_grad():
                out = model.generate(
                    prompt,
                    attention_mask=torch.ones_like(prompt),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    use_cache=True,
                    pad_token_id=0,
                )
            return out[:, prompt.shape[1] :].tolist()  # type: ignore[no-any-return]

    else:
        precision = {
            "aiayn": Precision(dtype=case["dtype"]),
            "aiayn-int8": Precision(dtype=case["dtype"], quantize="int8"),
            "aiayn-bf16": Precision(dtype="bfloat16"),
        }[impl]
        model = apply_precision(aiayn.load(folder).model, torch.device("cpu"), precision)

        def run(new: int) -> list[list[int]]:
            return generate(
                model, prompt.tolist(), max_new_tokens=new, sampling=SamplingConfig(temperature=0)
            )

    run(16)
    t0 = time.perf_counter()
    ids = run(case["new"])
    return {"tok_s": case["batch"] * case["new"] / (time.perf_counter() - t0), "ids": ids}


def measure(case: dict[str, Any]) -> dict[str, Any]:
    return measure_train(case) if case["what"] == "train" else measure_generate(case)


def quality(threads: int, dtype: str) -> dict[str, Any]:
    """Train configs/shakespeare_char.toml from scratch; validation loss and wall time."""
    import tempfile

    from aiayn.data.files import data_dir
    from aiayn.training.config import load_run_config
    from aiayn.training.lm import train_lm

    config = Path(__file__).resolve().parent.parent / "configs" / "shakespeare_char.toml"
    run = load_run_config(config, {"train.threads": threads, "train.dtype": dtype})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        result = train_lm(run, out, data_dir(None), progress=False)
    wall = time.perf_counter() - t0
    print(
        f"quality: {config.name}, {run.train.max_steps} steps, {dtype}: validation loss"
        f" {result.val_loss:.4f} (target <= 1.88, nanoGPT's figure) in {wall:.0f} s wall\n"
    )
    return {"val_loss": result.val_loss, "wall_s": wall, "steps": run.train.max_steps}


def generation_table(args: argparse.Namespace, common: dict[str, Any]) -> dict[str, Any]:
    """Every engine on every generation case, interleaved; tokens/s, aiayn's ratio to each,
    and the ids compared: every fp32 engine must give aiayn's, the int8 ones are scored by
    their agreement with it."""
    impls = ["aiayn", "hf"]
    if args.engines:
        impls += ["aiayn-int8", *ct2_impls(args.threads)]
        if cpu_has_bf16() and args.dtype == "float32":
            impls.append("aiayn-bf16")
    print(
        f"\n{'generation':<18}{'batch':>6}  {'engine':<15}{'tok/s':>22}{'aiayn int8 / it':>16}"
        f"{'aiayn / it':>11}{'same ids':>10}"
    )
    table: dict[str, Any] = {}
    for shape in args.gen_shapes or GEN_SHAPES:
        for batch in (1, 8):
            cases = [
                {
                    "name": impl,
                    "what": "generate",
                    "shape": shape,
                    "impl": impl,
                    "batch": batch,
                    "new": args.new_tokens,
                    **common,
                    **engine_threads(impl),
                }
                for impl in impls
            ]
            got = interleaved(__file__, cases, args.rounds)
            rows = engine_rows(got, lambda r: r["tok_s"], f"{shape:<18}{batch:>6}  ")
            if rows is not None:
                table[f"{shape}/b{batch}"] = rows
    return table


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=10, help="timed training steps per process")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument(
        "--engines",
        action="store_true",
        help="generation: also aiayn with int8 (and bf16) weights, and CTranslate2 at"
        " fp32 and int8 (its converter, on the same HF folder), on the run's threads and on one",
    )
    ap.add_argument(
        "--gen-shapes",
        nargs="*",
        choices=list(GEN_SHAPES),
        default=None,
        help="generation shapes (default: all)",
    )
    ap.add_argument("--quick", action="store_true", help="1 round, few steps: a smoke run")
    ap.add_argument("--no-quality", action="store_true", help="skip the 2,000-step training run")
    ap.add_argument("--no-train", action="store_true", help="skip the training-speed table")
    ap.add_argument("--no-generate", action="store_true", help="skip the generation table")
    ap.add_argument(
        "--compile", action="store_true", help="training: each implementation compiled too"
    )
    ap.add_argument("--json", default=None, help="default benchmarks/results/lm_DTYPE[_PARTS].json")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.repeat, args.new_tokens = 1, 2, 32
    torch.set_num_threads(args.threads)
    rates = host_rates()
    print(f"{rates_line(rates)}; {args.threads} threads; {args.dtype}; {args.rounds} rounds\n")
    results: dict[str, Any] = {
        "args": vars(args),
        "torch": torch.__version__,
        "rates_before": rates,
    }
    if not args.no_quality:
        results["quality"] = quality(args.threads, args.dtype)
    common = {"dtype": args.dtype, "threads": args.threads}
    mm = rates["mm_bf16_gflops" if args.dtype == "bfloat16" else "best_fp32_gflops"] * 1e9

    if not args.no_train:
        print(f"{'training':<14}{'model':<24}{'ms/iter':>22}{'MFU':>7}{'aiayn faster':>14}")
        results["train"] = {}
        for shape in SHAPES:
            cases = [
                {
                    "name": impl,
                    "what": "train",
                    "shape": shape,
                    "impl": impl,
                    "repeat": args.repeat,
                    **common,
                }
                for impl in [
                    *BUILD,
                    *(VARIANTS if args.dtype == "float32" else {}),
                    *([name + COMPILED for name in BUILD] if args.compile else []),
                ]
            ]
            got = interleaved(__file__, cases, args.rounds)
            rows = {
                impl: spread([r["s"] * 1e3 for r in runs]) for impl, runs in got.items() if runs
            }
            for impl, ms in rows.items():
                ratio = ms["median"] / rows["aiayn"]["median"] if "aiayn" in rows else math.nan
                mfu = train_flops(SHAPES[shape]) / (ms["median"] / 1e3) / mm
                ms |= {"mfu": mfu, "aiayn_faster": ratio}
                print(f"{shape:<14}{impl:<24}{cell(ms, '.1f'):>22}{mfu:>7.1%}{ratio:>13.2f}x")
            if got.get("aiayn"):  # the oneDNN choice of each round's aiayn process
                rows["aiayn"]["onednn_by_round"] = [bool(r["onednn"]) for r in got["aiayn"]]
            results["train"][shape] = rows

    if not args.no_generate:
        results["generate"] = generation_table(args, common)
    results["rates_after"] = host_rates()
    print(f"\nafter: {rates_line(results['rates_after'])}")
    # A partial run names its parts, so that it does not replace a full run's results.
    parts = [p for p in ("quality", "train", "generate") if not getattr(args, f"no_{p}")]
    suffix = ("" if len(parts) == 3 else "_" + "_".join(parts)) + (
        "_compile" if args.compile else ""
    )
    out = Path(
        args.json or Path(__file__).resolve().parent / "results" / f"lm_{args.dtype}{suffix}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    if not child_main(measure):
        sys.exit(main())
