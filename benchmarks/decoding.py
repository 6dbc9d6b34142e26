"""Greedy decoding, eager against captured, and against CTranslate2, at 1 and 2 threads.

    python benchmarks/decoding.py [--rounds 3] [--new-tokens 64] [--batches 1 8]
                                  [--shapes gpt2-small marian-small] [--marian-batches 1 64]
                                  [--no-ct2] [--no-profile]
                                  [--json ...]

Hugging Face folders of random weights (benchmarks/engines.py) -- GPT-2 (greedy, 32-token
prompts) and Marian-small (``--shapes marian-small``: beam 4, alpha 0.6, 16-token sources, at
``--marian-batches`` sentences a batch, 8 sentences or one batch, whichever is more) -- are
decoded by:

* aiayn, eager (``compile="off"``) and with its captured step (``compile="on"``:
  aiayn/generate/captured.py), fp32 and int8 weights;
* CTranslate2 (its own converter of the same folder), fp32 and int8 (``compute_type``).

Every engine decodes the same inputs to exactly ``--new-tokens`` tokens (GPT-2) or 40 (Marian),
EOS forbidden, at 1 and at 2 threads (every pool of the process: torch's, OpenMP's, BLAS's), each case
in a fresh process, the cases interleaved round by round (benchmarks/rounds.py).  A case's
time includes the prompt; a captured case's first generation (the capture, or its load from
inductor's disk cache) is timed separately as ``capture_s``.  Ratios are stated best thread
count against best thread count, and the thread count aiayn's ``--threads auto`` picks
(aiayn/generate/threads.py) is printed beside them.

A profile (skipped with ``--no-profile``) then splits batch-1 decoding of each aiayn mode
into time inside the matrix products (fbgemm's int8 kernel, oneDNN's or MKL's fp32 one) and
time outside them, with PyTorch's profiler, in this process: a GPT-2 int8 step, and a whole
Marian beam search (encoder, steps and beam bookkeeping, fp32 and int8).  (The eager GPT-2
fp32 step's one-row products run in numpy's BLAS, which the profiler does not see, so it is
not split; beam 4 has four rows, which never go there.)  The host's matmul rate and CPU flags are printed
first; the results go to JSON (default benchmarks/results/decoding.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from engines import (
    GPT2_SMALL,
    MARIAN_SMALL,
    ct2_engine,
    ct2_folder,
    ct2_tokens,
    gpt2_folder,
    marian_folder,
)
from rounds import cell, child_main, host_rates, interleaved, rates_line, spread

import aiayn
from aiayn.device import cpu_flags
from aiayn.generate import SamplingConfig, generate
from aiayn.generate.beam import BeamConfig, beam_search
from aiayn.generate.threads import decode_threads
from aiayn.models.precision import Precision, apply_precision
from aiayn.nn.cpu_decoding import for_decoding

ROOT = Path(__file__).resolve().parent / ".engines"
SHAPES = {
    "gpt2-small": {**GPT2_SMALL, "n_positions": 1024},
    # a small model: where one thread may beat two (the thread rule's other side)
    "small-6x256": {
        "n_layer": 6,
        "n_embd": 256,
        "n_head": 4,
        "vocab_size": 8000,
        "n_positions": 512,
    },
    "marian-small": MARIAN_SMALL,  # beam 4, one batch of sources at a time
}
PROMPT = 32


def _prompts(case: dict[str, Any]) -> list[list[int]]:
    vocab = SHAPES[case["shape"]]["vocab_size"]
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab - 1, (case["batch"], PROMPT), generator=gen).tolist()


def _loaded(folder: Path, precision: str) -> Any:
    quantize = "int8" if precision == "int8" else None
    return apply_precision(
        aiayn.load(folder).model, torch.device("cpu"), Precision(quantize=quantize)
    ).eval()


def _aiayn_runner(case: dict[str, Any], folder: Path) -> Any:
    model = _loaded(folder, case["precision"])
    prompts, greedy = _prompts(case), SamplingConfig(temperature=0)

    def run(new: int) -> list[list[int]]:
        return generate(model, prompts, max_new_tokens=new, sampling=greedy, compile=case["mode"])

    return run


def _ct2_runner(case: dict[str, Any], folder: Path) -> Any:
    ct2 = ct2_folder(folder)
    tokens = ct2_tokens(ct2)
    index = {t: i for i, t in enumerate(tokens)}
    impl = "ct2-int8" if case["precision"] == "int8" else "ct2-float32"
    gen = ct2_engine("generator", ct2, impl, case["threads"])
    start = [[tokens[i] for i in row] for row in _prompts(case)]

    def run(new: int) -> list[list[int]]:
        out = gen.generate_batch(
            start, max_length=new, min_length=new, sampling_topk=1, include_prompt_in_result=False
        )
        return [[index[t] for t in r.sequences[0]] for r in out]

    return run


MARIAN_V = MARIAN_SMALL["vocab_size"]
SOURCE, OUT, SENTENCES = 16, 40, 8  # Marian: source tokens (then </s>), output tokens (EOS
# forbidden), sentences translated (at least)


def _sentences(batch: int) -> int:
    """Sentences a Marian case translates: SENTENCES, or one batch where a batch is larger."""
    return max(SENTENCES, batch)


def _sources(case: dict[str, Any]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(2, MARIAN_V - 1, (_sentences(case["batch"]), SOURCE), generator=gen)
    src = torch.cat([src, torch.zeros(len(src), 1, dtype=torch.long)], dim=1)  # then </s>
    return list(src.split(case["batch"]))


def _ct2_translator(case: dict[str, Any], folder: Path, chunks: list[torch.Tensor]) -> Any:
    ct2 = ct2_folder(folder)
    tokens = ct2_tokens(ct2)
    index = {t: i for i, t in enumerate(tokens)}
    impl = "ct2-int8" if case["precision"] == "int8" else "ct2-float32"
    engine = ct2_engine("translator", ct2, impl, case["threads"])

    def run() -> list[list[int]]:
        out = []
        for c in chunks:
            rows = [[tokens[i] for i in row] for row in c.tolist()]
            found = engine.translate_batch(
                rows,
                beam_size=4,
                length_penalty=0.6,
                max_decoding_length=OUT,
                min_decoding_length=OUT,
            )
            out += [[index[t] for t in r.hypotheses[0]] for r in found]
        return out

    return run


def _marian_runner(case: dict[str, Any]) -> Any:
    """Beam 4 (alpha 0.6) to exactly OUT tokens, EOS forbidden, batch by batch: aiayn's
    beam_search (eager or captured) or CTranslate2's translate_batch."""
    folder, chunks = marian_folder(ROOT), _sources(case)
    if case["engine"] == "ct2":
        return _ct2_translator(case, folder, chunks)
    model = _loaded(folder, case["precision"])
    config = BeamConfig(beam_size=4, length_penalty=0.6, max_extra=OUT - SOURCE - 1)

    def run() -> list[list[int]]:
        return _translated(model, chunks, config, case["mode"])

    return run


def _translated(
    model: Any, chunks: list[torch.Tensor], config: BeamConfig, compile_: str
) -> list[list[int]]:
    """Beam search over ``chunks`` in one decoding block, as ``aiayn.generate.translate`` runs
    its batches: the kernels are chosen and fp32 weights packed once for all of them.  The
    decoder starts from <pad>, as Marian's does; EOS (0) is forbidden."""
    rows = chunks[0].shape[0] * config.beam_size
    with for_decoding(model, rows):
        return [
            row
            for c in chunks
            for row in beam_search(
                model, c, bos=MARIAN_V - 1, eos=0, config=config, never=(0,), compile=compile_
            )
        ]


def _timed(run: Any, tokens: int) -> dict[str, Any]:
    start = time.perf_counter()
    run()  # the capture (or its load from disk), and the warm-up
    capture_s = time.perf_counter() - start
    start = time.perf_counter()
    ids = run()
    seconds = time.perf_counter() - start
    return {"tok_s": tokens / seconds, "capture_s": capture_s, "ids": ids}


def measure(case: dict[str, Any]) -> dict[str, Any]:
    if case["shape"] == "marian-small":
        return _timed(_marian_runner(case), _sentences(case["batch"]) * OUT)
    folder = gpt2_folder(ROOT, SHAPES[case["shape"]])
    run = _ct2_runner(case, folder) if case["engine"] == "ct2" else _aiayn_runner(case, folder)
    start = time.perf_counter()
    run(case["new"])  # the capture (or its load from disk) of these shapes, and the warm-up
    capture_s = time.perf_counter() - start
    start = time.perf_counter()
    ids = run(case["new"])
    seconds = time.perf_counter() - start
    return {"tok_s": case["batch"] * case["new"] / seconds, "capture_s": capture_s, "ids": ids}


def cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for shape in args.shapes:
        for batch in args.marian_batches if shape == "marian-small" else args.batches:
            for precision in ("fp32", "int8"):
                engines = [("aiayn", "off"), ("aiayn", "on")] + (
                    [] if args.no_ct2 else [("ct2", "")]
                )
                for engine, mode in engines:
                    for threads in (1, 2):
                        name = f"{shape}/b{batch}/{precision}/{engine}{'-' + mode if mode else ''}/{threads}t"
                        out.append(
                            {
                                "name": name,
                                "shape": shape,
                                "batch": batch,
                                "precision": precision,
                                "engine": engine,
                                "mode": mode,
                                "threads": threads,
                                "new": args.new_tokens,
                            }
                        )
    return out


def _auto_threads(shape: str, precision: str, batch: int) -> int:
    """The thread count ``--threads auto`` gives this case on a 2-core budget."""
    marian = shape == "marian-small"
    folder = marian_folder(ROOT) if marian else gpt2_folder(ROOT, SHAPES[shape])
    model = _loaded(folder, precision)
    return decode_threads("auto", model, batch * (4 if marian else 1), cores=2)


def summarise(
    runs: dict[str, list[dict[str, Any]]], all_cases: list[dict[str, Any]]
) -> dict[str, Any]:
    by = {c["name"]: c for c in all_cases}
    table: dict[str, dict[str, Any]] = {}
    for name, results in runs.items():
        if not results:
            continue
        c = by[name]
        group = f"{c['shape']}/b{c['batch']}/{c['precision']}"
        engine = c["engine"] + (f"-{c['mode']}" if c["mode"] else "")
        row = table.setdefault(group, {}).setdefault(engine, {})
        row[f"{c['threads']}t"] = spread([r["tok_s"] for r in results])
        row[f"{c['threads']}t_capture_s"] = spread([r["capture_s"] for r in results])
    for group, engines in table.items():
        shape, batch, precision = group.split("/")
        auto = _auto_threads(shape, precision, int(batch[1:]))
        best = {e: max(v[k]["median"] for k in ("1t", "2t") if k in v) for e, v in engines.items()}
        engines["auto_threads"] = auto
        if "ct2" in best:
            for mode in ("aiayn-off", "aiayn-on"):
                if mode in best:
                    engines[f"{mode}_vs_ct2_best"] = best[mode] / best["ct2"]
                    auto_key = f"{auto}t"
                    if auto_key in engines[mode]:
                        engines[f"{mode}_auto_vs_ct2_best"] = (
                            engines[mode][auto_key]["median"] / best["ct2"]
                        )
    return table


def print_table(table: dict[str, Any]) -> None:
    for group, engines in table.items():
        print(
            f"\n{group} (tokens/s, median (min-max); --threads auto picks {engines['auto_threads']})"
        )
        for engine, row in engines.items():
            if isinstance(row, dict):
                cells = "   ".join(
                    f"{k}: {cell(v, '.1f')}" for k, v in row.items() if not k.endswith("capture_s")
                )
                print(f"  {engine:10s} {cells}")
        for k, v in engines.items():
            if k.endswith("_vs_ct2_best"):
                print(f"  {k}: {v:.2f}x")


PRODUCTS = (
    "quantized::linear_dynamic",
    "aten::addmm",
    "aten::mm",
    "aten::linear",
    "mkldnn::_linear_pointwise",
    "aten::bmm",
)


def _split(run: Any, steps: int) -> dict[str, float]:
    """ms per step of ``run`` (which makes ``steps`` steps): wall time, time in the matrix
    products by PyTorch's profiler (their own time, ``PRODUCTS``), and the rest."""
    run()  # warm
    start = time.perf_counter()
    run()
    wall = 1e3 * (time.perf_counter() - start) / steps
    with torch.profiler.profile() as prof:
        run()
    inside = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in PRODUCTS)
    inside_ms = inside / steps / 1e3
    return {
        "step_ms": wall,
        "products_ms": inside_ms,
        "outside_ms": wall - inside_ms,
        "outside_share": 1 - inside_ms / wall,
    }


def profile_step(shape: str, precision: str, threads: int) -> dict[str, dict[str, float]]:
    """ms per batch-1 GPT-2 step in the matrix products and outside them, eager and captured."""
    from aiayn.generate.captured import captured_step

    torch.set_num_threads(threads)
    model = _loaded(gpt2_folder(ROOT, SHAPES[shape]), precision)
    ids = torch.tensor(_prompts({"shape": shape, "batch": 1}))
    out, steps = {}, 20
    with torch.no_grad(), for_decoding(model, 1):
        for mode in ("eager", "captured"):
            static = mode == "captured"
            cache = model.new_static_cache(1, 128) if static else model.new_cache(1, 128)
            if static:
                cache.reserve(PROMPT)
            model(ids, cache=cache)
            nxt = ids[:, -1:]
            step = captured_step(model) if static else (lambda t, c: model(t, cache=c))

            def run(step: Any = step, cache: Any = cache, nxt: Any = nxt) -> None:
                for _ in range(steps):
                    step(nxt, cache)

            out[mode] = _split(run, steps)
    return out


def profile_marian(precision: str, threads: int) -> dict[str, dict[str, float]]:
    """ms per step of Marian-small beam 4 at batch 1, whole searches (encoder, steps and beam
    bookkeeping) split into the matrix products and the rest, eager and captured."""
    torch.set_num_threads(threads)
    model = _loaded(marian_folder(ROOT), precision)
    chunks = _sources({"batch": 1})[:4]
    config = BeamConfig(beam_size=4, length_penalty=0.6, max_extra=OUT - SOURCE - 1)
    out = {}
    for mode, compile_ in (("eager", "off"), ("captured", "on")):

        def run(compile_: str = compile_) -> None:
            _translated(model, chunks, config, compile_)

        out[mode] = _split(run, len(chunks) * OUT)
    return out


def _profiles(shapes: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    found = {}
    for t in (1, 2):
        for shape in shapes:
            if shape == "marian-small":
                for precision in ("fp32", "int8"):
                    found[f"marian-small/b1/{precision}/{t}t"] = profile_marian(precision, t)
            else:
                found[f"{shape}/b1/int8/{t}t"] = profile_step(shape, "int8", t)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="GPT-2's batches")
    ap.add_argument("--marian-batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["gpt2-small"])
    ap.add_argument("--no-ct2", action="store_true", help="aiayn only")
    ap.add_argument("--no-profile", action="store_true", help="skip the batch-1 step profile")
    ap.add_argument(
        "--json", default=str(Path(__file__).resolve().parent / "results" / "decoding.json")
    )
    args = ap.parse_args()
    rates = host_rates()
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))
    print(f"{rates_line(rates)}; CPU flags: {' '.join(flags)}")
    all_cases = cases(args)
    runs = interleaved(__file__, all_cases, args.rounds)
    table = summarise(runs, all_cases)
    print_table(table)
    results: dict[str, Any] = {
        "host": {**rates, "flags": flags},
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "table": table,
    }
    if not args.no_profile:
        results["profile"] = _profiles(args.shapes)
        print("\nbatch-1 step, ms (in the products / outside them):")
        for k, v in results["profile"].items():
            print(
                "  "
                + k
                + ": "
                + "; ".join(
                    f"{m} {r['step_ms']:.2f} ({r['products_ms']:.2f} / {r['outside_ms']:.2f},"
                    f" {100 * r['outside_share']:.0f}% outside)"
                    for m, r in v.items()
                )
            )
    results["rates_after"] = host_rates()
    tmp = Path(args.json).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(args.json)  # whole or not at all
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    if not child_main(measure):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        main()
