"""The int8 products of one Marian-small beam step, kernel by kernel, against CTranslate2's
whole step: the bound of int8 beam search at batch 1.

    python benchmarks/int8_products.py [--rounds 5] [--repeat 15] [--no-ct2] [--json ...]

A Marian-small decoder step at batch 1 with beam 4 multiplies 4 rows by 37 int8 weights, in
the order a step reads them (per layer the fused query-key-value, the output, the
cross-attention query and output, the two feed-forward products; then the output layer):
26 MB of int8, more than a core's L2, so each weight comes from L3 as it does in decoding.
Each candidate runs the 37 products with the same integers and scales:

* ``aiayn``: ``aiayn::int8_dynamic_linear`` (aiayn/nn/int8_kernel.py), the operator a decoding
  step calls: fbgemm's dynamic int8 product behind aiayn's Python kernel;
* ``fbgemm``: ``quantized::linear_dynamic`` called directly (the operator's kernel alone);
* ``onednn``: oneDNN's ``onednn::qlinear_pointwise`` with activations quantized beforehand
  (the quantization not timed: its best case);
* ``int_mm``: ``torch._int_mm`` (int8 x int8 -> int32) on activations quantized beforehand,
  the weight column-major, nothing dequantized (its best case).

``ct2`` is CTranslate2's whole step -- encoder, decoder, beam search -- on the same Marian-small
shape in int8 (benchmarks/decoding.py's sentences: 8 sources of 16 tokens to 40 tokens, beam 4,
batch 1), in ms per output token: an upper bound on its products.  Each round runs the
kernels (interleaved ``--repeat`` times, the median kept) and CTranslate2, at 1 and at 2
threads, each in a fresh process, the order rotated per round (benchmarks/rounds.py); each
figure is the median (min-max) over rounds.  The host's matmul rate and CPU flags are printed first; the results go to JSON (default
benchmarks/results/int8_products.json).

Shapes: R rows (beams), I in features, O out features.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from engines import MARIAN_SMALL
from rounds import cell, child_main, host_rates, interleaved, rates_line, spread

from aiayn.device import cpu_flags
from aiayn.nn.int8_kernel import INT8_ACTIVATION_BITS, int8_dynamic_linear, packed
from aiayn.nn.quantized import Int8Linear

ROWS = 4  # beam 4 at batch 1


def step_shapes(shape: dict[str, int]) -> list[tuple[int, int]]:
    """(I, O) of each int8 product of one decoder step, in the order the step runs them."""
    d, ffn = shape["d_model"], shape["decoder_ffn_dim"]
    layer = [(d, 3 * d), (d, d), (d, d), (d, d), (d, ffn), (ffn, d)]
    return layer * shape["decoder_layers"] + [(d, shape["vocab_size"])]


def _layers(shapes: list[tuple[int, int]]) -> list[Int8Linear]:
    torch.manual_seed(0)
    return [Int8Linear.from_linear(torch.nn.Linear(i, o)) for i, o in shapes]


def _quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(R, I) fp32 -> uint8 rows with one scale and zero point, as fbgemm's dynamic product
    quantizes them."""
    lo, hi = x.aminmax()
    lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    scale = ((hi - lo) / 255).clamp_min(1e-8)
    zero = torch.round(-lo / scale).long()
    return torch.round(x / scale + zero).clamp(0, 255).to(torch.uint8), scale, zero


def candidates(layers: list[Int8Linear]) -> dict[str, Callable[[], Any]]:
    """Each kernel's 37 products, as one call."""
    xs = [torch.randn(ROWS, m.in_features) for m in layers]
    handles = [packed(m) for m in layers]
    fbgemm = [
        torch.ops.quantized.linear_prepack(
            torch._make_per_channel_quantized_tensor(
                m.qweight, m.scale.double(), torch.zeros(m.out_features, dtype=torch.long), 0
            ),
            m.bias.float() if m.bias is not None else None,
        )
        for m in layers
    ]
    onednn = [torch.ops.onednn.qlinear_prepack(m.qweight, [ROWS, m.in_features]) for m in layers]
    quantized = [_quantized_rows(x) for x in xs]
    signed = [(x / x.abs().amax() * 127).round().to(torch.int8) for x in xs]
    zeros = [torch.zeros(m.out_features, dtype=torch.long) for m in layers]
    reduce_range = INT8_ACTIVATION_BITS == 7

    def aiayn() -> None:
        for m, x, h in zip(layers, xs, handles, strict=True):
            int8_dynamic_linear(x, m.qweight, h, reduce_range)

    def fbgemm_direct() -> None:
        for x, p in zip(xs, fbgemm, strict=True):
            torch.ops.quantized.linear_dynamic(x, p, reduce_range)

    def onednn_prequantized() -> None:
        for m, (q, s, z), p, wz in zip(layers, quantized, onednn, zeros, strict=True):
            torch.ops.onednn.qlinear_pointwise.tensor(
                q, s, z, p, m.scale, wz, m.bias, 1.0, 0, torch.float32, "none", [], ""
            )

    def int_mm() -> None:
        for m, q in zip(layers, signed, strict=True):
            torch._int_mm(q, m.qweight.t())

    return {
        "aiayn": aiayn,
        "fbgemm": fbgemm_direct,
        "onednn": onednn_prequantized,
        "int_mm": int_mm,
    }


def _ct2_step(threads: int) -> tuple[Callable[[], Any], int]:
    """CTranslate2's int8 Marian-small searches (benchmarks/decoding.py's) and their steps."""
    from decoding import OUT, _marian_runner, _sentences

    case = {
        "shape": "marian-small",
        "batch": 1,
        "precision": "int8",
        "engine": "ct2",
        "threads": threads,
        "mode": "off",
    }
    return _marian_runner(case), _sentences(1) * OUT


def _ms(fn: Callable[[], Any], repeat: int, calls: int = 1) -> float:
    """Median ms of ``repeat`` calls of ``fn``, per one of its ``calls`` steps."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start) / calls)
    return statistics.median(times)


def measure(case: dict[str, Any]) -> dict[str, float]:
    """One case in its own process: the kernels, interleaved ``repeat`` times (ms a step), or
    CTranslate2's searches (ms an output token).  CTranslate2 has a process to itself: its
    OpenMP threads keep spinning after a call, and would slow what ran next."""
    warnings.simplefilter("ignore")  # PyTorch's quantized tensors are deprecated
    if case["what"] == "ct2":
        run, steps = _ct2_step(case["threads"])
        run()  # the model load and the warm-up
        return {"ct2": _ms(run, 3, steps)}
    fns = candidates(_layers(step_shapes(MARIAN_SMALL)))
    for f in fns.values():
        f()  # packing and thread pools
    found: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(case["repeat"]):
        for k, f in fns.items():
            found[k].append(_ms(f, 1))
    return {k: statistics.median(v) for k, v in found.items()}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--no-ct2", action="store_true", help="the kernels only")
    ap.add_argument(
        "--json",
        default=str(Path(__file__).resolve().parent / "results" / "int8_products.json"),
    )
    args = ap.parse_args()
    rates = host_rates()
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))
    print(f"{rates_line(rates)}; CPU flags: {' '.join(flags)}")
    mb = sum(i * o for i, o in step_shapes(MARIAN_SMALL)) / 1e6
    print(f"one Marian-small step: {ROWS} rows x 37 int8 weights, {mb:.1f} MB; ms per step")
    cases = [
        {"name": f"{what}-{t}t", "what": what, "threads": t, "repeat": args.repeat}
        for t in (1, 2)
        for what in ("kernels", *(() if args.no_ct2 else ("ct2",)))
    ]
    runs = interleaved(__file__, cases, args.rounds)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for case in cases:
        row = table.setdefault(f"{case['threads']}t", {})
        for k in runs[case["name"]][0] if runs[case["name"]] else ():
            row[k] = spread([r[k] for r in runs[case["name"]]])
    for t, row in table.items():
        print(f"  {t}: " + "  ".join(f"{k} {cell(v, '.2f')}" for k, v in row.items()))
    results = {"host": {**rates, "flags": flags}, "rows": ROWS, "weights_mb": mb, "table": table}
    tmp = Path(args.json).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(args.json)  # whole or not at all
    print(f"wrote {args.json}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if not child_main(measure):
        main()
