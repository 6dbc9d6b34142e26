"""Translation model speed, side by side with peers in one run (fp32, CPU).

    python benchmarks/translation_speed.py [--threads 2] [--repeat 10] [--json ...]

1. Training: tokens/s and model-FLOPs utilisation of one optimizer step (forward, label-smoothed
   loss, backward, Adam) for a 3+3-layer, 256-wide, 4-head, d_ff 1024, 8k-vocabulary
   encoder-decoder on a ~4k-token batch (128 pairs × 32 tokens per side), against
   ``torch.nn.Transformer`` with embeddings and tied output, and HF ``MarianMTModel`` of the
   same size.  MFU = training FLOPs (aiayn.inspect.calc, PaLM convention) / time / the fp32
   matmul rate measured in the same run (torch.mm; oneDNN's rate is printed beside it).
2. Beam search (beam 4, α 0.6) sentences/s on 64 Multi30k test sentences against HF Marian's
   ``generate(num_beams=4)``.  Both models have random weights, so neither stops early:
   both decode every sentence to the same length limit (source length + 50), equal work.
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
from bench_common import matmul_rates, median_time
from torch import nn

import aiayn
from aiayn.data.bpe import BOS, EOS, PAD
from aiayn.data.files import data_dir, read_lines
from aiayn.generate.beam import BeamConfig, beam_search
from aiayn.inspect.calc import training_flops_per_token
from aiayn.nn.positions import sinusoidal_table

V, D, H, FF, LAYERS, PAIRS, LEN = 8000, 256, 4, 1024, 3, 128, 32


def ours() -> nn.Module:
    return aiayn.build_model(
        "paper-base", n_layers=LAYERS, d_model=D, n_heads=H, d_ff=FF, vocab_size=V, max_len=256
    )


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with the paper's embeddings, sinusoids and tied output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.register_buffer("pe", sinusoidal_table(256, D), persistent=False)
        self.core = nn.Transformer(D, H, LAYERS, LAYERS, FF, dropout=0.1, batch_first=True)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        s = self.embed(src) * math.sqrt(D) + self.pe[: src.shape[1]]
        t = self.embed(tgt) * math.sqrt(D) + self.pe[: tgt.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.head(self.core(s, t, tgt_mask=mask, tgt_is_causal=True))


def marian() -> nn.Module:
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=V, d_model=D, encoder_layers=LAYERS, decoder_layers=LAYERS,
        encoder_attention_heads=H, decoder_attention_heads=H, encoder_ffn_dim=FF, decoder_ffn_dim=FF,
        max_position_embeddings=256, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        activation_function="relu", pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=BOS,
        forced_eos_token_id=None, scale_embedding=True, share_encoder_decoder_embeddings=True,
    )  # fmt: skip
    return MarianMTModel(cfg)


def train_step_time(model: nn.Module, kind: str, repeat: int) -> float:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, V, (PAIRS, LEN), generator=g)
    tgt = torch.randint(3, V, (PAIRS, LEN + 1), generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    model.train()

    def step() -> None:
        if kind == "marian":
            logits = model(input_ids=src, decoder_input_ids=tgt[:, :-1]).logits
        else:
            logits = model(src, tgt[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return median_time(step, repeat)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--data", default=None)
    ap.add_argument("--json", default="benchmarks/results/translation_speed.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    mm_rate, onednn_rate = matmul_rates()
    print(
        f"fp32 matmul: torch.mm {mm_rate:.0f} GFLOP/s, oneDNN {onednn_rate:.0f} GFLOP/s, {args.threads} threads\n"
    )
    results: dict[str, Any] = {
        "threads": args.threads,
        "mm_gflops": mm_rate,
        "onednn_gflops": onednn_rate,
    }

    model = ours()
    flops = training_flops_per_token(model.config, LEN) * PAIRS * LEN
    tokens = PAIRS * LEN * 2  # source + target tokens per step
    print(
        f"{'training':<24}{'ms/step':>9}{'tokens/s':>10}{'MFU(mm)':>9}{'MFU(oneDNN)':>12}{'vs aiayn':>10}"
    )
    rows: dict[str, dict[str, float]] = {}
    for name, build, kind in (
        ("aiayn", ours, "ours"),
        ("torch.nn.Transformer", TorchTransformer, "torch"),
        ("hf-marian", marian, "marian"),
    ):
        try:
            sec = train_step_time(build(), kind, args.repeat)
        except ImportError as err:
            print(f"{name:<24} skipped: {err}")
            continue
        rows[name] = {
            "ms_per_step": sec * 1e3,
            "tokens_per_s": tokens / sec,
            "mfu_mm": flops / sec / (mm_rate * 1e9),
            "mfu_onednn": flops / sec / (onednn_rate * 1e9),
        }
    for name, r in rows.items():
        print(
            f"{name:<24}{r['ms_per_step']:>9.0f}{r['tokens_per_s']:>10,.0f}{r['mfu_mm']:>9.1%}{r['mfu_onednn']:>12.1%}{r['ms_per_step'] / rows['aiayn']['ms_per_step']:>9.2f}x"
        )
    results["train"] = rows

    lines = read_lines(data_dir(args.data) / "multi30k" / "test_2016_flickr.de.gz")[
        : args.sentences
    ]
    g = torch.Generator().manual_seed(0)
    lengths = [min(len(line.split()) + 4, 40) for line in lines]  # BPE-like lengths
    src = torch.full((len(lines), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, V, (n,), generator=g)
    model = ours().eval()
    t0 = time.perf_counter()
    beam_search(
        model,
        src,
        bos=BOS,
        eos=EOS,
        config=BeamConfig(beam_size=4, length_penalty=0.6, max_extra=50),
    )
    ours_s = time.perf_counter() - t0
    try:
        hf = marian().eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            hf.generate(
                input_ids=src, attention_mask=src != PAD, num_beams=4, length_penalty=0.6, early_stopping=True,
                max_new_tokens=max(lengths) + 50, min_new_tokens=max(lengths) + 50, do_sample=False,
            )  # fmt: skip
        hf_s = time.perf_counter() - t0
    except ImportError as err:
        print(f"hf-marian generate skipped: {err}")
        hf_s = float("nan")
    n = len(lines)
    print(
        f"\nbeam search (beam 4), {n} sentences: aiayn {n / ours_s:.1f} sentences/s, HF Marian {n / hf_s:.1f} sentences/s, ratio {hf_s / ours_s:.2f}x"
    )
    results["beam"] = {"sentences": n, "aiayn_s": ours_s, "hf_s": hf_s, "ratio": hf_s / ours_s}
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
