"""Translation model speed against peers: every measurement in a fresh process, the
implementations interleaved round by round, medians with min-max (benchmarks/rounds.py).

    python benchmarks/translation_speed.py [--dtype float32|bfloat16] [--rounds 3] [--threads 2]
                                           [--repeat 5] [--quick] [--no-train] [--json ...]

1. Training: one optimizer step (forward, label-smoothed loss, backward, Adam 0.9/0.98/1e-9)
   of a 3+3-layer, 256-wide, 4-head, d_ff 1024, 8k-vocabulary encoder-decoder on a ~4k-token
   batch (128 pairs x 32 tokens a side), against ``torch.nn.Transformer`` with the paper's
   embeddings and tied output, and HF ``MarianMTModel`` of the same size.  Everyone gets the
   same batch, threads, dtype (fp32, or bf16 autocast with ``--dtype bfloat16``), warm-up,
   repeats and optimizer (``torch.optim.Adam(fused=True)``), and no dropout:
   ``torch.nn.Transformer``'s one dropout rate also drops attention weights and FFN
   activations, where aiayn and the paper drop only sublayer outputs, so the only placement
   all three can share is none.  aiayn computes its loss as its trainer does (the chunked
   fused cross-entropy, ``model(src, tgt, targets=...)``); the peers through their logits.
   In fp32 aiayn's linear layers run on oneDNN if it measures faster than MKL on this host at
   the batch's row count (the probe the trainer runs, aiayn/training/loop.py); the row
   "aiayn-mkl" forces MKL, to show how much of the result is the host's oneDNN.
   MFU = training FLOPs (aiayn.inspect.calc, PaLM count) / time / torch.mm's rate in the same
   dtype, measured in the same run.
2. Beam search (beam 4, alpha 0.6, up to source length + 50) on Multi30k test sentences at
   batch 64 and batch 1 against HF Marian's ``generate(num_beams=4)``; and at batch 64 with
   every sentence of a batch as long as its longest ("equal": the same work for both, since
   HF's one limit per call decodes every sentence to the longest one's).  Random weights, so
   neither stops early; HF is held to the same length.  With ``--dtype bfloat16`` both
   models' weights are cast to bf16.

The host's fp32 and bf16 matmul rates and its oneDNN/MKL ratio are printed before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from engines import (
    MARIAN_SMALL,
    ct2_engine,
    ct2_folder,
    ct2_impls,
    ct2_tokens,
    engine_rows,
    engine_threads,
    marian_folder,
)
from rounds import cell, child_main, host_rates, interleaved, rates_line, spread
from torch import nn

import aiayn
from aiayn.data.bpe import BOS, EOS, PAD
from aiayn.data.files import data_dir, read_lines
from aiayn.device import cpu_has_bf16
from aiayn.generate.beam import BeamConfig, beam_search
from aiayn.inspect.calc import training_flops_per_token
from aiayn.models.precision import Precision, apply_precision
from aiayn.nn.cpu_decoding import for_decoding
from aiayn.nn.positions import sinusoidal_table

V, D, H, FF, LAYERS, PAIRS, LEN = 8000, 256, 4, 1024, 3, 128, 32
ENGINE_ROOT = Path(__file__).resolve().parent / ".engines"  # the HF folders all engines read


def ours() -> nn.Module:
    return aiayn.build_model(
        "paper-base",
        n_layers=LAYERS,
        d_model=D,
        attention={"n_heads": H},
        ffn={"d_ff": FF},
        vocab_size=V,
        max_len=256,
        dropout=0.0,
    )


class TorchTransformer(nn.Module):
    """torch.nn.Transformer with the paper's embeddings, sinusoids and tied output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.register_buffer("pe", sinusoidal_table(256, D), persistent=False)
        self.core = nn.Transformer(D, H, LAYERS, LAYERS, FF, dropout=0.0, batch_first=True)
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
        vocab_size=V,
        d_model=D,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=H,
        decoder_attention_heads=H,
        encoder_ffn_dim=FF,
        decoder_ffn_dim=FF,
        max_position_embeddings=256,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation_function="relu",
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
    )
    return MarianMTModel(cfg)


BUILD = {"aiayn": ours, "torch.nn.Transformer": TorchTransformer, "hf-marian": marian}
# aiayn with MKL's linears forced (no oneDNN): how much of its fp32 lead is this host's oneDNN.
VARIANTS = {"aiayn-mkl": ours}


def autocast(dtype: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def measure_train(case: dict[str, Any]) -> dict[str, float]:
    """Median seconds of one optimizer step, after two untimed ones."""
    from bench_common import median_time

    from aiayn.nn.cpu_kernels import choose_training_kernel, for_training

    torch.manual_seed(0)
    impl = case["impl"]
    model = {**BUILD, **VARIANTS}[impl]().train()
    fp32 = case["dtype"] == "float32"
    kernel = choose_training_kernel("auto", PAIRS * LEN, D, fp32)[0] if impl == "aiayn" else "mkl"
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, V, (PAIRS, LEN), generator=g)
    tgt = torch.randint(3, V, (PAIRS, LEN + 1), generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)

    def step() -> None:
        with autocast(case["dtype"]):
            if impl.startswith("aiayn"):
                loss = model(src, tgt[:, :-1], targets=tgt[:, 1:], label_smoothing=0.1)
            else:
                if impl == "hf-marian":
                    logits = model(input_ids=src, decoder_input_ids=tgt[:, :-1]).logits
                else:
                    logits = model(src, tgt[:, :-1])
                loss = F.cross_entropy(
                    logits.flatten(0, 1).float(), tgt[:, 1:].flatten(), label_smoothing=0.1
                )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with for_training(model, kernel):  # as the trainer does (the bf16 row padding too)
        return {"s": median_time(step, case["repeat"]), "onednn": float(kernel == "onednn")}


def sources(case: dict[str, Any]) -> torch.Tensor:
    """Random ids at the lengths of real Multi30k test sentences (BPE-like: words + 4).

    With ``case["equal"]`` every sentence of a batch is as long as the batch's longest, so
    both decoders do the same work: HF's ``generate`` has one length limit per call and
    decodes every sentence to the longest one's, where aiayn stops each at its own source
    length + 50 (§6.1) and drops it from the batch."""
    lines = read_lines(Path(case["data"]) / "multi30k" / "test_2016_flickr.de.gz")
    lines = lines[: case["sentences"]]
    g = torch.Generator().manual_seed(0)
    lengths = [min(len(line.split()) + 4, 40) for line in lines]
    if case.get("equal"):
        b = case["batch"]
        lengths = [max(lengths[i - i % b : i - i % b + b]) for i in range(len(lengths))]
    src = torch.full((len(lines), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, V, (n,), generator=g)
    return src


def measure_beam(case: dict[str, Any]) -> dict[str, float]:
    """Seconds to decode every sentence, ``batch`` sentences at a time."""
    torch.manual_seed(0)
    src, batch = sources(case), case["batch"]
    model = (ours() if case["impl"] == "aiayn" else marian()).eval()
    if case["dtype"] == "bfloat16":
        model = model.to(torch.bfloat16)
    chunks = [src[i : i + batch] for i in range(0, len(src), batch)]
    chunks = [c[:, : int((c != PAD).sum(1).max())] for c in chunks]  # no all-PAD columns

    def decode(c: torch.Tensor) -> None:
        if case["impl"] == "aiayn":
            config = BeamConfig(beam_size=4, length_penalty=0.6, max_extra=50)
            # EOS masked, as HF's min_new_tokens masks it: both decode to the length limit
            beam_search(model, c, bos=BOS, eos=EOS, config=config, never=(EOS,))
        else:
            n = c.shape[1] + 50
            model.generate(
                input_ids=c,
                attention_mask=c != PAD,
                num_beams=4,
                length_penalty=0.6,
                early_stopping=True,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
            )

    # aiayn's decoding products run on weights packed once per run, as `aiayn translate` does
    # (aiayn/generate/translate.py): the same run-time choice, per weight shape, of packed
    # oneDNN weights or F.linear (and of gemv for one row) that it makes, so a host where
    # packing is slower does not pack.  Packing inside the timed loop, once per batch, is what
    # a bare beam_search call does.  HF has no such step.
    packing = for_decoding(model, 4 * batch) if case["impl"] == "aiayn" else None
    with torch.no_grad(), packing or contextlib.nullcontext():
        decode(chunks[0][:1, :8])  # warm-up, untimed
        t0 = time.perf_counter()
        for c in chunks:
            decode(c)
    return {"s": time.perf_counter() - t0}


MARIAN_V = MARIAN_SMALL["vocab_size"]
ENGINE_SOURCE, ENGINE_OUT = 16, 40  # source tokens (then </s>); output tokens, EOS forbidden


def engine_sources(sentences: int) -> torch.Tensor:
    """(N, 17) random source ids of Marian's vocabulary (not </s>, <unk> or <pad>), then </s>."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(2, MARIAN_V - 1, (sentences, ENGINE_SOURCE), generator=g)
    return torch.cat([src, torch.zeros(sentences, 1, dtype=torch.long)], dim=1)


def measure_engine(case: dict[str, Any]) -> dict[str, Any]:
    """Seconds to translate every sentence, ``batch`` at a time, with beam 4 (alpha 0.6) to
    exactly 40 tokens (EOS forbidden), and the ids: aiayn (fp32, int8 weights, bf16), HF
    Marian's ``generate`` and CTranslate2 (fp32, int8), all from one Marian folder."""
    impl, folder = case["impl"], marian_folder(ENGINE_ROOT)
    src, batch = engine_sources(case["sentences"]), case["batch"]
    chunks = [src[i : i + batch] for i in range(0, len(src), batch)]
    if impl.startswith("ct2-"):
        ct2 = ct2_folder(folder)
        tokens = ct2_tokens(ct2)
        index = {t: i for i, t in enumerate(tokens)}
        engine = ct2_engine("translator", ct2, impl, case["threads"])

        def decode(c: torch.Tensor) -> list[list[int]]:
            out = engine.translate_batch(
                [[tokens[i] for i in row] for row in c.tolist()],
                beam_size=4,
                length_penalty=0.6,
                max_decoding_length=ENGINE_OUT,
                min_decoding_length=ENGINE_OUT,
            )
            return [[index[t] for t in r.hypotheses[0]] for r in out]

    elif impl == "hf-marian":
        from transformers import MarianMTModel

        model = MarianMTModel.from_pretrained(folder).eval()

        def decode(c: torch.Tensor) -> list[list[int]]:
            with torch.no_grad():
                out = model.generate(
                    input_ids=c,
                    num_beams=4,
                    length_penalty=0.6,
                    max_new_tokens=ENGINE_OUT,
                    min_new_tokens=ENGINE_OUT,
                    do_sample=False,
                    early_stopping=True,
                )
            return out[:, 1:].tolist()  # type: ignore[no-any-return]

    else:
        precision = {
            "aiayn": Precision(dtype="float32"),
            "aiayn-int8": Precision(dtype="float32", quantize="int8"),
            "aiayn-bf16": Precision(dtype="bfloat16"),
        }[impl]
        model = apply_precision(aiayn.load(folder).model, torch.device("cpu"), precision)
        config = BeamConfig(
            beam_size=4, length_penalty=0.6, max_extra=ENGINE_OUT - ENGINE_SOURCE - 1
        )

        def decode(c: torch.Tensor) -> list[list[int]]:
            # EOS (0) forbidden, the decoder starting from <pad>, as Marian's does
            return beam_search(model, c, bos=MARIAN_V - 1, eos=0, config=config, never=(0,))  # type: ignore[arg-type]

    packing = for_decoding(model, 4 * batch) if impl.startswith("aiayn") else None
    with torch.no_grad(), packing or contextlib.nullcontext():
        decode(chunks[0][:1])  # warm-up, untimed
        t0 = time.perf_counter()
        ids = [row for c in chunks for row in decode(c)]
    return {"s": time.perf_counter() - t0, "ids": ids}


def measure(case: dict[str, Any]) -> dict[str, Any]:
    if case["what"] == "engine":
        return measure_engine(case)
    return measure_train(case) if case["what"] == "train" else measure_beam(case)


def engines_table(args: argparse.Namespace, common: dict[str, Any]) -> dict[str, Any]:
    """Marian-small shape, beam 4 to 40 tokens, at batch 64 and 1: every engine interleaved;
    sentences/s, aiayn's ratios, and every engine's ids against aiayn fp32's."""
    impls = ["aiayn", "aiayn-int8", "hf-marian", *ct2_impls(args.threads)]
    if cpu_has_bf16():
        impls.append("aiayn-bf16")
    print(
        f"\n{'Marian-small, beam 4':<22}{'engine':<15}{'sentences/s':>22}{'aiayn int8 / it':>16}"
        f"{'aiayn / it':>11}{'same ids':>10}"
    )
    table: dict[str, Any] = {}
    for batch, n in ((64, args.engine_sentences), (1, args.engine_sentences_b1)):
        cases = [
            {
                "name": impl,
                "what": "engine",
                "impl": impl,
                "batch": batch,
                "sentences": n,
                **common,
                **engine_threads(impl),
            }
            for impl in impls
        ]
        got = interleaved(__file__, cases, args.rounds)
        rows = engine_rows(got, lambda r, n=n: n / r["s"], f"{'batch ' + str(batch):<22}", ".2f")
        if rows is not None:
            table[f"b{batch}"] = rows
    return table


def training_table(
    args: argparse.Namespace, rates: dict[str, float], common: dict[str, Any]
) -> dict[str, Any]:
    """The training-step table: every implementation interleaved, printed and returned."""
    train_cases = [
        {"name": impl, "what": "train", "impl": impl, "repeat": args.repeat, **common}
        for impl in [*BUILD, *(VARIANTS if args.dtype == "float32" else {})]
    ]
    got = interleaved(__file__, train_cases, args.rounds)
    flops = training_flops_per_token(ours().config, LEN) * PAIRS * LEN
    mm = rates["mm_bf16_gflops" if args.dtype == "bfloat16" else "best_fp32_gflops"] * 1e9
    print(
        f"{'training step':<24}{'ms/step':>22}{'src+tgt tok/s':>15}{'MFU':>7}{'aiayn faster':>14}"
    )
    rows: dict[str, Any] = {}
    for impl, runs in got.items():
        if runs:
            rows[impl] = spread([r["s"] * 1e3 for r in runs])
    for impl, ms in rows.items():
        sec = ms["median"] / 1e3
        ratio = ms["median"] / rows["aiayn"]["median"] if "aiayn" in rows else math.nan
        rows[impl] |= {
            "tokens_per_s": 2 * PAIRS * LEN / sec,
            "mfu": flops / sec / mm,
            "aiayn_faster": ratio,
        }
        print(
            f"{impl:<24}{cell(ms):>22}{2 * PAIRS * LEN / sec:>15,.0f}{flops / sec / mm:>7.1%}{ratio:>13.2f}x"
        )
    return rows


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=5, help="timed training steps per process")
    ap.add_argument("--sentences", type=int, default=64, help="beam search at batch 64")
    ap.add_argument("--sentences-b1", type=int, default=8, help="beam search at batch 1")
    ap.add_argument("--quick", action="store_true", help="1 round, 2 steps: a smoke run")
    ap.add_argument("--no-train", action="store_true", help="skip the training table")
    ap.add_argument(
        "--engines",
        action="store_true",
        help="only the engines table: Marian-small shape, beam 4 to 40 tokens, aiayn"
        " at fp32, int8 (and bf16) against HF Marian and CTranslate2 at fp32 and int8, on the"
        " run's threads and on one",
    )
    ap.add_argument("--engine-sentences", type=int, default=128, help="engines table, batch 64")
    ap.add_argument("--engine-sentences-b1", type=int, default=8, help="engines table, batch 1")
    ap.add_argument("--data", default=None)
    ap.add_argument(
        "--json",
        default=None,
        help="default benchmarks/results/translation_speed_DTYPE[_beam].json",
    )
    return ap


def main() -> int:
    args = _parser().parse_args()
    if args.quick:
        args.rounds, args.repeat, args.sentences, args.sentences_b1 = 1, 2, 8, 2
    torch.set_num_threads(args.threads)
    common = {"dtype": args.dtype, "threads": args.threads, "data": str(data_dir(args.data))}
    rates = host_rates()
    print(f"{rates_line(rates)}; {args.threads} threads; {args.dtype}; {args.rounds} rounds\n")
    results: dict[str, Any] = {"args": vars(args), "rates_before": rates}
    if args.engines:
        results["engines"] = engines_table(args, common)
        results["rates_after"] = host_rates()
        print(f"\nafter: {rates_line(results['rates_after'])}")
        out = Path(
            args.json
            or Path(__file__).resolve().parent / "results" / "translation_speed_engines.json"
        )
        out.write_text(json.dumps(results, indent=2))
        print(f"wrote {out}")
        return 0

    if not args.no_train:
        results["train_ms_per_step"] = training_table(args, rates, common)

    beam_cases = [
        {
            "name": f"b{b}{tag}/{impl}",
            "what": "beam",
            "impl": impl,
            "batch": b,
            "sentences": n,
            "equal": tag == "=",
            **common,
        }
        for b, n, tag in (
            (64, args.sentences, ""),
            (64, args.sentences, "="),
            (1, args.sentences_b1, ""),
        )
        for impl in ("aiayn", "hf-marian")
    ]
    got = interleaved(__file__, beam_cases, args.rounds)
    print(f"\n{'beam search (beam 4)':<24}{'sentences/s':>22}{'aiayn faster':>14}")
    beams: dict[str, Any] = {}
    for case in beam_cases:
        runs = got[case["name"]]
        if runs:
            beams[case["name"]] = spread([case["sentences"] / r["s"] for r in runs])
    for b in ("64", "64=", "1"):  # "64=": every sentence of a batch at the longest's length
        ours_s, hf_s = beams.get(f"b{b}/aiayn"), beams.get(f"b{b}/hf-marian")
        ratio = ours_s["median"] / hf_s["median"] if ours_s and hf_s else math.nan
        for name, sp in ((f"b{b}/aiayn", ours_s), (f"b{b}/hf-marian", hf_s)):
            if sp is not None:
                sp["aiayn_faster"] = 1.0 if name.endswith("aiayn") else ratio
                label = f"batch {b.rstrip('=')}{' equal' if b.endswith('=') else ''}"
                print(
                    f"{label + ' ' + name.split('/')[1]:<24}{cell(sp, '.2f'):>22}{sp['aiayn_faster']:>13.2f}x"
                )
    results["beam_sentences_per_s"] = beams
    results["rates_after"] = host_rates()
    print(f"\nafter: {rates_line(results['rates_after'])}")
    # A partial run names itself, so that it does not replace a full run's results.
    suffix = "_beam" if args.no_train else ""
    out = Path(
        args.json
        or Path(__file__).resolve().parent
        / "results"
        / f"translation_speed_{args.dtype}{suffix}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    if not child_main(measure):
        sys.exit(main())
