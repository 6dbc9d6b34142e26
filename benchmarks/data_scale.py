"""Corpora at the paper's scale: preprocessing, training start-up, memory and the reader's
speed, at 29k, 290k and 4.5M sentence pairs.

    python benchmarks/data_scale.py [--sizes 29000 290000 4500000] [--work DIR]

The corpora are made here, never downloaded: Multi30k's German-English training pairs
(``$AIAYN_DATA/multi30k``) recombined -- each pair one to three random pairs joined, so that
sentences run about as long as WMT14's -- and shuffled, written as plain text.  For each size:

* ``aiayn preprocess`` (every core): wall time, and the peak memory of its process tree
  (sampled from /proc every 0.1 s);
* ``aiayn train`` of the README's translation config (configs/multi30k_de_en.toml) from the
  shards for 20 steps: seconds from the process's start to its first logged step, peak RSS
  (the process's own maximum, from wait4) and tokens/s; then ``--resume`` for 5 more steps,
  and its seconds to the first step;
* the reader: batches per second that the translation task delivers from the shards (planned,
  read and collated, as training draws them), against the batches per second training
  consumes.

The baseline is the same training from Multi30k's plain files (how every run started before
shards): its start-up and peak RSS.  The host's fp32 matmul rate is printed before and after.
Results go to benchmarks/results/data_scale.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "multi30k_de_en.toml"
TRAIN_STEPS, RESUME_STEPS = 20, 5


def cpu_name() -> str:
    """The CPU's model and its matrix-unit flags (never a host's nickname)."""
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    have = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    return f"{model} ({', '.join(have) or 'no AVX-512'}), {os.cpu_count()} cores"


def make_corpus(data: Path, pairs: int, out: Path, seed: int = 0) -> tuple[Path, Path]:
    """``pairs`` line pairs, each one to three Multi30k training pairs joined, shuffled."""
    src, tgt = out / "train.de", out / "train.en"
    if src.is_file() and tgt.is_file():
        return src, tgt
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(data / "multi30k/train.de.gz", "rt") as f_de:
        de = f_de.read().splitlines()
    with gzip.open(data / "multi30k/train.en.gz", "rt") as f_en:
        en = f_en.read().splitlines()
    rng = np.random.default_rng(seed)
    step = 500_000
    tmp_src, tmp_tgt = out / ".train.de.tmp", out / ".train.en.tmp"
    with open(tmp_src, "w") as fs, open(tmp_tgt, "w") as ft:
        for start in range(0, pairs, step):
            n = min(step, pairs - start)
            picks = rng.integers(0, len(de), (n, 3))
            counts = rng.choice([1, 2, 3], size=n, p=[0.3, 0.4, 0.3])
            for row, k in zip(picks.tolist(), counts.tolist(), strict=True):
                fs.write(" ".join(de[i] for i in row[:k]) + "\n")
                ft.write(" ".join(en[i] for i in row[:k]) + "\n")
    os.replace(tmp_src, src)
    os.replace(tmp_tgt, tgt)
    return src, tgt


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (from /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return total


def run_measured(argv: list[str], watch: Path | None = None) -> dict[str, Any]:
    """Run ``argv``; its wall time, the peak RSS of its process tree (sampled), its own peak
    RSS (wait4), and -- with ``watch``, a log.csv -- the seconds to its first new row."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a fresh run's log.csv has its header first; a resumed run's, its earlier rows
    start_rows = len(watch.read_text().splitlines()) if watch and watch.is_file() else 1
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    peak, first = [0], [None]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            new_row = watch and first[0] is None and watch.is_file()
            if new_row and len(watch.read_text().splitlines()) > start_rows:  # type: ignore[union-attr]
                first[0] = time.perf_counter() - t0  # type: ignore[assignment]
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{output[-3000:]}")
    return {
        "seconds": seconds,
        "tree_peak_rss_mb": peak[0] / 1e6,
        "peak_rss_mb": usage.ru_maxrss * 1024 / 1e6,
        "first_step_s": first[0],
        "output": output,
    }


def train_args(out: Path, extra: list[str], steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aiayn",
        "train",
        str(CONFIG),
        "--out",
        str(out),
        "--set",
        f"train.max_steps={steps}",
        "--set",
        "train.eval_interval=1000000",
        "--set",
        "train.checkpoint_interval=1000000",
        "--set",
        "train.keep_snapshots=0",
        *extra,
    ]


def tokens_per_s(log: Path) -> float:
    rows = [line.split(",") for line in log.read_text().splitlines()[1:]]
    rates = [float(r[4]) for r in rows[3:]] or [float(r[4]) for r in rows]
    return float(np.median(rates))


def reader_rate(shards: Path, max_tokens: int, batches: int = 300) -> tuple[float, float]:
    """Batches per second the translation task delivers from ``shards`` (planned from the
    lengths, read from the map and collated), and the mean real target tokens per batch."""
    from aiayn.training.translate import TokenShards, TranslationTask

    source = TokenShards(shards)
    train, valid = source.splits(source.tokenizer(), 256)
    task = TranslationTask(train, valid, max_tokens=max_tokens, label_smoothing=0.1, seed=1)
    t0 = time.perf_counter()
    tokens = 0
    for _ in range(batches):
        ((_, _, tgt_out),) = task.next_batches(1, 0, 1)
        tokens += int((tgt_out != 0).sum())
    return batches / (time.perf_counter() - t0), tokens / batches


def measure_size(pairs: int, data: Path, work: Path, workers: int | None) -> dict[str, Any]:
    corpus = work / f"synth-{pairs}"
    src, tgt = make_corpus(data, pairs, corpus)
    shards = corpus / "shards"
    pre = [
        sys.executable,
        "-m",
        "aiayn",
        "preprocess",
        "--source",
        str(src),
        "--target",
        str(tgt),
        "--valid-source",
        str(data / "multi30k/val.de.gz"),
        "--valid-target",
        str(data / "multi30k/val.en.gz"),
        "--vocab-size",
        "8000",
        "--max-len",
        "256",
        "--out",
        str(shards),
        "--overwrite",
    ]
    if workers:
        pre += ["--workers", str(workers)]
    prep = run_measured(pre)
    header = json.loads((shards / "header.json").read_text())
    run = corpus / "run"
    shutil.rmtree(run, ignore_errors=True)
    extra = ["--data", str(corpus), "--set", f"data.shards={shards}"]
    train = run_measured(train_args(run, extra, TRAIN_STEPS), watch=run / "log.csv")
    resume_extra = ["--data", str(corpus), "--set", f"data.shards={shards}", "--resume"]
    resume = run_measured(
        train_args(run, resume_extra, TRAIN_STEPS + RESUME_STEPS), watch=run / "log.csv"
    )
    rate, tokens = reader_rate(shards, 4096)
    consumed = tokens_per_s(run / "log.csv") / tokens
    return {
        "pairs": pairs,
        "kept_pairs": header["splits"]["train"]["pairs"],
        "tokens": header["splits"]["train"]["source"]["tokens"]
        + header["splits"]["train"]["target"]["tokens"],
        "shards_mb": sum(f.stat().st_size for f in shards.iterdir()) / 1e6,
        "preprocess_s": prep["seconds"],
        "preprocess_peak_mb": prep["tree_peak_rss_mb"],
        "first_step_s": train["first_step_s"],
        "resume_first_step_s": resume["first_step_s"],
        "train_peak_rss_mb": train["peak_rss_mb"],
        "resume_peak_rss_mb": resume["peak_rss_mb"],
        "train_tokens_per_s": tokens_per_s(run / "log.csv"),
        "reader_batches_per_s": rate,
        "train_batches_per_s": consumed,
        "reader_over_training": rate / consumed,
    }


def baseline(data: Path, work: Path) -> dict[str, Any]:
    """Training from Multi30k's plain files, as every run started before shards."""
    run = work / "files-run"
    shutil.rmtree(run, ignore_errors=True)
    extra = ["--data", str(data)]
    got = run_measured(train_args(run, extra, TRAIN_STEPS), watch=run / "log.csv")
    return {
        "pairs": 29_000,
        "first_step_s": got["first_step_s"],
        "train_peak_rss_mb": got["peak_rss_mb"],
        "train_tokens_per_s": tokens_per_s(run / "log.csv"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[29_000, 290_000, 4_500_000])
    ap.add_argument("--work", default=None, help="where the corpora go (default: a temp folder)")
    ap.add_argument(
        "--data", default=os.environ.get("AIAYN_DATA", str(ROOT.parent / "shared/data"))
    )
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/data_scale.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from aiayn.device import matmul_gflops

    data = Path(args.data)
    work = Path(args.work or tempfile.mkdtemp(prefix="aiayn-data-scale-"))
    before = matmul_gflops(2048)
    print(f"{cpu_name()}; torch.mm fp32 {before:.0f} GFLOP/s; corpora in {work}")
    results: dict[str, Any] = {"cpu": cpu_name(), "mm_fp32_gflops_before": before, "sizes": []}
    base = baseline(data, work)
    results["plain_files"] = base
    print(
        f"plain files (Multi30k, 29k pairs): first step after {base['first_step_s']:.1f} s,"
        f" peak RSS {base['train_peak_rss_mb']:,.0f} MB, {base['train_tokens_per_s']:,.0f} tokens/s"
    )
    head = (
        f"{'pairs':>10} {'prep s':>8} {'prep MB':>8} {'1st step s':>10} {'resume s':>9}"
        f" {'train MB':>9} {'vs files':>8} {'reader b/s':>10} {'train b/s':>9} {'ratio':>6}"
    )
    print(head)
    for pairs in args.sizes:
        r = measure_size(pairs, data, work, args.workers)
        r["rss_over_plain_files"] = r["train_peak_rss_mb"] / base["train_peak_rss_mb"]
        results["sizes"].append(r)
        print(
            f"{pairs:>10,} {r['preprocess_s']:>8.1f} {r['preprocess_peak_mb']:>8,.0f}"
            f" {r['first_step_s']:>10.1f} {r['resume_first_step_s']:>9.1f}"
            f" {r['train_peak_rss_mb']:>9,.0f} {r['rss_over_plain_files']:>7.2f}x"
            f" {r['reader_batches_per_s']:>10,.0f} {r['train_batches_per_s']:>9.2f}"
            f" {r['reader_over_training']:>5,.0f}x",
            flush=True,
        )
    results["mm_fp32_gflops_after"] = matmul_gflops(2048)
    print(f"torch.mm fp32 after: {results['mm_fp32_gflops_after']:.0f} GFLOP/s")
    results["max_rss_of_this_process_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
