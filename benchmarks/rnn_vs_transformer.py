"""The Transformer against the RNN encoder-decoders it replaced, on Multi30k de->en (issue 13).

    python benchmarks/rnn_vs_transformer.py speed      # time per training step vs length
    python benchmarks/rnn_vs_transformer.py train      # the budgets, trained and scored
    python benchmarks/rnn_vs_transformer.py reach      # gradient norm vs distance, trained

* ``speed``: one training step (forward, backward, AdamW) of 32 sentences of L source and L
  target tokens, L = 8 ... 128, for the Transformer and both GRU baselines; every measurement
  in a fresh process, the models interleaved round by round (benchmarks/rounds.py).  An RNN
  runs L sequential steps per layer; a Transformer layer runs a constant number.
* ``train``: the Transformer trains configs/multi30k_de_en.toml for its steps.  Each RNN gets
  two budgets, fixed as numbers of steps before it trains (no wall-clock stop anywhere):
  equal FLOPs -- the steps whose counted FLOPs (aiayn.inspect.calc.translation_batch_flops
  over the very batches trained on) reach the Transformer's -- and equal wall-clock -- the
  Transformer's steps times its measured step time over the RNN's, both measured on the same
  real batches, interleaved, once (kept in OUT/step_seconds.json, so that a resumed run keeps
  its budget).  Every run is resumable; each is scored by
  sacreBLEU on test_2016_flickr (beam 4) with its training tokens/s.
* ``reach``: for the trained models (``--steps N``: a Transformer trained N steps and the
  GRUs trained as long, when the train stage's folders are not at hand), the gradient of the
  last prediction's loss with respect to the decoder input k positions back (aiayn/evaluation/gradient_reach.py), over the
  validation sentences with at least 20 target tokens: the measured counterpart of 0.9^k.

Writes benchmarks/results/rnn_vs_transformer.json and PNG plots beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rounds import child_main, host_rates, interleaved, rates_line, spread

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {
    "transformer": ROOT / "configs" / "multi30k_de_en.toml",
    "gru-attention": ROOT / "configs" / "multi30k_gru_attention.toml",
    "gru-plain": ROOT / "configs" / "multi30k_gru_plain.toml",
}
RESULTS = ROOT / "benchmarks" / "results" / "rnn_vs_transformer.json"
LENGTHS = (8, 16, 32, 64, 128)


def _model(name: str, vocab: int = 8000) -> Any:
    from aiayn.models import build_model
    from aiayn.training.config import load_run_config

    run = load_run_config(CONFIGS[name])
    return build_model(run.model.replace(vocab_size=vocab, pad_id=0)), run


def measure(case: dict[str, Any]) -> dict[str, float]:
    """One training step of ``case`` (a child process of :func:`interleaved`)."""
    torch.manual_seed(0)
    model, _ = _model(case["model"])
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    n, length = 32, int(case["length"])
    src = torch.randint(4, 8000, (n, length))
    tgt = torch.randint(4, 8000, (n, length + 1))
    times = []
    for i in range(7):
        t0 = time.perf_counter()
        loss = model(src, tgt[:, :-1], targets=tgt[:, 1:], label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:  # two warm-up steps
            times.append(time.perf_counter() - t0)
    return {"ms": 1000 * statistics.median(times)}


def stage_speed(rounds: int) -> dict[str, Any]:
    cases = [
        {"name": f"{m}@{length}", "model": m, "length": length, "threads": torch.get_num_threads()}
        for length in LENGTHS
        for m in CONFIGS
    ]
    got = interleaved(__file__, cases, rounds)
    table: dict[str, dict[str, Any]] = {m: {} for m in CONFIGS}
    for c in cases:
        if got[c["name"]]:
            table[c["model"]][str(c["length"])] = spread([r["ms"] for r in got[c["name"]]])
    print(f"{'L':>5}" + "".join(f"{m:>28}" for m in CONFIGS))
    for length in LENGTHS:
        row = [table[m].get(str(length)) for m in CONFIGS]
        cells = [f"{s['median']:.0f} ms ({s['min']:.0f}-{s['max']:.0f})" if s else "-" for s in row]
        print(f"{length:>5}" + "".join(f"{c:>28}" for c in cells))
    _plot_speed(table)
    return table


def _plot_speed(table: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for m, by_len in table.items():
        xs = sorted(int(k) for k in by_len)
        ax.plot(xs, [by_len[str(x)]["median"] for x in xs], "o-", label=m)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sentence length L (source = target)")
    ax.set_ylabel("ms per training step (32 sentences)")
    ax.set_title("time per training step against length", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS.with_name("rnn_vs_transformer_speed.png"), dpi=120)


def _batches(run: Any, tokenizer: Any, root: Path, steps: int) -> list[tuple[int, int, int]]:
    """(sentences, source, target) of the first ``steps`` training batches, in order."""
    from aiayn.data.batching import batch_shapes
    from aiayn.training.translate import encode_pairs, load_pairs

    pairs = encode_pairs(load_pairs(run, root, "train"), tokenizer)
    lengths = [(len(s), len(t) - 1) for s, t in pairs]
    shapes = batch_shapes(lengths, run.train.max_tokens, seed=run.train.seed, batches=steps)
    return [(n, src, tgt) for n, src, tgt, _ in shapes]


def _equal_flops_steps(run: Any, config: Any, tokenizer: Any, root: Path, target: float) -> int:
    from aiayn.inspect.calc import translation_batch_flops

    total, steps = 0.0, 0
    for n, s, t in _batches(run, tokenizer, root, 200_000):
        if total >= target:
            break
        total += translation_batch_flops(config, n, s, t)
        steps += 1
    return steps


def _step_seconds(
    names: list[str], tokenizer: Any, root: Path, n_batches: int = 12
) -> dict[str, float]:
    """Median seconds per training step on the same real batches, models interleaved."""
    from aiayn.data.batching import token_batches
    from aiayn.training.config import load_run_config
    from aiayn.training.translate import collate, encode_pairs, load_pairs

    run = load_run_config(CONFIGS["transformer"])
    pairs = encode_pairs(load_pairs(run, root, "train"), tokenizer)
    lengths = [(len(s), len(t) - 1) for s, t in pairs]
    batches = token_batches(lengths, run.train.max_tokens, seed=run.train.seed)[:n_batches]
    data = [collate([pairs[i] for i in b]) for b in batches]
    models = {m: _model(m, tokenizer.vocab_size)[0].train() for m in names}
    opts = {m: torch.optim.AdamW(models[m].parameters(), lr=1e-4, fused=True) for m in names}
    times: dict[str, list[float]] = {m: [] for m in names}
    for r, (src, tgt_in, tgt_out) in enumerate(data):
        order = names[r % len(names) :] + names[: r % len(names)]
        for m in order:
            t0 = time.perf_counter()
            models[m](src, tgt_in, targets=tgt_out, label_smoothing=0.1).backward()
            opts[m].step()
            opts[m].zero_grad(set_to_none=True)
            if r >= 2:
                times[m].append(time.perf_counter() - t0)
    return {m: statistics.median(v) for m, v in times.items()}


def _train(config: Path, out: Path, steps: int, root: Path) -> dict[str, Any]:
    """``aiayn train`` to a fixed number of steps (resumed when the folder holds a run).
    Every model trains on MKL's linear layers: the step times that fix the equal-wall-clock
    budgets are measured with them, and oneDNN's host-dependent speed-up (aiayn/nn/cpu_kernels.py)
    would favour the Transformer, whose time is mostly linear layers."""
    from aiayn.checkpoint import RunDir

    # A run killed before its first checkpoint left only its log: nothing to resume, start over.
    resume = ["--resume"] if RunDir(out).latest() is not None else ["--overwrite"]
    cmd = [
        sys.executable,
        "-m",
        "aiayn",
        "train",
        str(config),
        "--out",
        str(out),
        "--data",
        str(root),
        "--set",
        f"train.max_steps={steps}",
        "train.linear_kernel=mkl",
        *resume,
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return {"steps": steps, "wall_s_last_invocation": time.perf_counter() - t0}


def _score(folder: Path, root: Path) -> dict[str, float]:
    from aiayn.checkpoint import load
    from aiayn.data.parallel import multi30k
    from aiayn.evaluation.translation import evaluate_translation

    bundle = load(folder / "checkpoint")
    pairs = multi30k(root / "multi30k", "test_2016_flickr", "de", "en")
    scores, _ = evaluate_translation(
        bundle.model.eval(),
        bundle.tokenizer,
        [p.source for p in pairs],  # type: ignore[arg-type]
        [p.target for p in pairs],
    )
    rows = (folder / "log.csv").read_text().splitlines()[1:]
    tok_s = [float(r.split(",")[4]) for r in rows if r.split(",")[4]]
    return {
        "test_bleu": scores.bleu,
        "test_chrf": scores.chrf,
        "train_tokens_per_s": statistics.median(tok_s) if tok_s else math.nan,
    }


def _equal_time_steps(tf_steps: int, seconds: dict[str, float], name: str) -> int:
    """The steps of model ``name`` that take as long as ``tf_steps`` Transformer steps, by
    the step times measured on the same batches."""
    return max(1, round(tf_steps * seconds["transformer"] / seconds[name]))


def stage_train(out: Path, root: Path) -> dict[str, Any]:
    from aiayn.checkpoint import load
    from aiayn.inspect.calc import translation_batch_flops
    from aiayn.models import build_model
    from aiayn.training.config import load_run_config

    result: dict[str, Any] = {}
    tf_run = load_run_config(CONFIGS["transformer"])
    tf_steps = tf_run.train.max_steps
    _train(CONFIGS["transformer"], out / "transformer", tf_steps, root)
    tokenizer = load(out / "transformer" / "checkpoint").tokenizer
    tf_config = tf_run.model.replace(vocab_size=tokenizer.vocab_size, pad_id=0)
    tf_flops = sum(
        translation_batch_flops(tf_config, *b) for b in _batches(tf_run, tokenizer, root, tf_steps)
    )
    # Measured once and kept: the equal-time budgets must not change when a run resumes.
    saved = out / "step_seconds.json"
    if saved.is_file():
        seconds = json.loads(saved.read_text())
    else:
        seconds = _step_seconds(list(CONFIGS), tokenizer, root)
        saved.write_text(json.dumps(seconds))
    result["step_seconds_same_batches"] = seconds
    result["transformer"] = {
        "steps": tf_steps,
        "flops": tf_flops,
        **_score(out / "transformer", root),
    }
    for name in ("gru-attention", "gru-plain"):
        run = load_run_config(CONFIGS[name])
        config = run.model.replace(vocab_size=tokenizer.vocab_size, pad_id=0)
        budgets = {
            "equal-flops": _equal_flops_steps(run, config, tokenizer, root, tf_flops),
            "equal-time": _equal_time_steps(tf_steps, seconds, name),
        }
        for budget, steps in budgets.items():
            folder = out / f"{name}-{budget}"
            _train(CONFIGS[name], folder, steps, root)
            result[f"{name}/{budget}"] = {
                "steps": steps,
                **_score(folder, root),
                "params": build_model(config).num_parameters(),
            }
            print(name, budget, result[f"{name}/{budget}"], flush=True)
    print(_markdown_table(result))
    return result


def _markdown_table(result: dict[str, Any]) -> str:
    """The train stage's rows as the README's table: budget, steps, test BLEU, chrF, tok/s."""
    lines = [
        "| model | budget | steps | test BLEU | chrF | train tok/s (median) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    labels = {
        "transformer": "Transformer 3+3 x 256",
        "gru-attention": "GRU + Bahdanau attention",
        "gru-plain": "GRU, last state only",
    }
    budgets = {"": "its config", "equal-flops": "equal FLOPs", "equal-time": "equal wall-clock"}
    for key, row in result.items():
        if not isinstance(row, dict) or "test_bleu" not in row:
            continue
        name, _, budget = key.partition("/")
        lines.append(
            f"| {labels[name]} | {budgets[budget]} | {row['steps']:,} | "
            f"{row['test_bleu']:.2f} | {row['test_chrf']:.2f} | {row['train_tokens_per_s']:,.0f} |"
        )
    return "\n".join(lines)


def _reach_models(out: Path, root: Path, steps: int | None) -> dict[str, Path]:
    """The trained models to measure: the train stage's folders in ``out``, or with ``steps``,
    the Transformer trained ``steps`` steps and each GRU its equal wall-clock (the train stage's
    measured step times), in ``out/reach-STEPS`` -- a shorter study when the full one's
    checkpoints are not at hand.  Resumable like the train stage."""
    if steps is None:
        folders = {p.name: p for p in sorted(out.glob("*")) if (p / "checkpoint").exists()}
        if not folders:
            raise SystemExit(f"no trained models in {out}: run the train stage, or reach --steps N")
        return folders
    saved = out / "step_seconds.json"
    if saved.is_file():
        seconds = json.loads(saved.read_text())
    elif "train" in (known := json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}):
        seconds = known["train"]["result"]["step_seconds_same_batches"]
    else:
        raise SystemExit("reach --steps needs the train stage's step times: run train first")
    folders = {}
    for name in CONFIGS:
        folder = out / f"reach-{steps}" / name
        n = _equal_time_steps(steps, seconds, name)
        _train(CONFIGS[name], folder, n, root)
        folders[f"{name} ({n:,} steps)"] = folder
    return folders


def stage_reach(out: Path, root: Path, steps: int | None, min_len: int = 20) -> dict[str, Any]:
    from aiayn.checkpoint import load
    from aiayn.evaluation.gradient_reach import gradient_by_distance
    from aiayn.training.config import load_run_config
    from aiayn.training.translate import collate, encode_pairs, load_pairs

    run = load_run_config(CONFIGS["transformer"])
    reach: dict[str, Any] = {}
    for label, folder in _reach_models(out, root, steps).items():
        bundle = load(folder / "checkpoint")
        pairs = [
            e
            for e in encode_pairs(load_pairs(run, root, "val"), bundle.tokenizer)  # type: ignore[arg-type]
            if len(e[1]) - 1 >= min_len
        ]
        batches = [collate(pairs[i : i + 16]) for i in range(0, len(pairs), 16)]
        means, counts = gradient_by_distance(
            bundle.model, batches, pad_id=0, max_distance=min_len - 1
        )  # type: ignore[arg-type]
        reach[label] = {"mean_grad_norm": means, "sentences": counts[0]}
        print(label, [f"{m:.3g}" for m in means[:: max(1, min_len // 5)]], flush=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for name, r in reach.items():
        ax.semilogy(range(len(r["mean_grad_norm"])), r["mean_grad_norm"], "o-", ms=3, label=name)
    ax.set_xlabel("k: decoder inputs back from the last prediction")
    ax.set_ylabel("mean ‖∂loss/∂input_(t-k)‖")
    ax.set_title(
        f"gradient reach, {reach and next(iter(reach.values()))['sentences']} val sentences",
        fontsize=10,
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS.with_name("rnn_vs_transformer_reach.png"), dpi=120)
    return reach


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("stage", choices=["speed", "train", "reach"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="runs/rnn_vs_transformer")
    ap.add_argument("--data", default=None)
    ap.add_argument(
        "--steps",
        type=int,
        default=None,
        help="reach: train the Transformer this many steps, the GRUs equal time",
    )
    args = ap.parse_args()
    from aiayn.data.files import data_dir

    rates = host_rates()
    print(rates_line(rates))
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    t0 = time.perf_counter()
    if args.stage == "speed":
        got: Any = stage_speed(args.rounds)
    elif args.stage == "train":
        got = stage_train(Path(args.out), data_dir(args.data))
    else:
        got = stage_reach(Path(args.out), data_dir(args.data), args.steps)
    results[args.stage] = {
        "host": rates,
        "threads": torch.get_num_threads(),
        "seconds": time.perf_counter() - t0,
        "result": got,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    if not child_main(measure):
        sys.exit(main())
