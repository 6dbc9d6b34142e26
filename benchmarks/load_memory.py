"""Peak memory while loading a large Hugging Face checkpoint folder: aiayn's loader against
HF's own ``from_pretrained``, each in a fresh process.

    python benchmarks/load_memory.py [--size-gb 2] [--shard-mb 500] [--dtype float32]

A Llama-shaped model of about ``--size-gb`` of weights (d_model 2048, vocabulary 32,000,
untied head, as many layers as fit) is written once as a sharded HF folder under
``--cache`` (model-0000x-of-0000N.safetensors and the index).  Then, in a fresh process
each, ``aiayn.interop.hf_folder.load_hf_folder`` and ``transformers.AutoModelForCausalLM.
from_pretrained`` load it.  Reported: the process's resident memory before loading (Python,
torch, transformers imported), and its peak (VmHWM) once every weight has been read (HF maps
the files and reads a weight on first use, so the peak is taken after touching each weight, as
a first forward pass would), as a ratio to the weights' size on disk.  Writes JSON beside the
other results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "load_memory.json"


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(which: str, folder: str) -> None:
    import torch
    import transformers

    from aiayn.interop.hf_folder import load_hf_folder

    before = _status("VmRSS")
    t0 = time.perf_counter()
    if which == "aiayn":
        model = load_hf_folder(folder)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
    seconds = time.perf_counter() - t0
    loaded = _status("VmHWM")
    # HF keeps the weights mapped from the files and reads them on first use: touch every
    # weight (as a first forward pass would) before taking the peak.
    with torch.no_grad():
        for p in model.parameters():
            p.sum()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    dtype = str(next(model.parameters()).dtype)
    print(
        json.dumps(
            {
                "rss_before": before,
                "peak_loaded": loaded,
                "peak": _status("VmHWM"),
                "after": _status("VmRSS"),
                "param_bytes": params,
                "seconds": seconds,
                "dtype": dtype,
                "threads": torch.get_num_threads(),
            }
        )
    )


def make(folder: Path, size_gb: float, shard_mb: int, dtype: str) -> int:
    import torch

    import aiayn
    from aiayn.interop.hf_folder import save_hf_folder

    bytes_per = 2 if dtype == "bfloat16" else 4
    d, vocab, ff = 2048, 32000, 5632
    per_layer = 2 * d * d + 2 * d * 512 + 3 * d * ff + 2 * d  # GQA: 4 KV heads of 128
    layers = max(1, round((size_gb * 1e9 / bytes_per - 2 * vocab * d) / per_layer))
    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        model = aiayn.build_model(
            "llama-style-small",
            n_layers=layers,
            d_model=d,
            attention={"n_heads": 16, "n_kv_heads": 4},
            ffn={"d_ff": ff},
            vocab_size=vocab,
            max_len=2048,
            tie_embeddings=False,
        )
        model = model.to(getattr(torch, dtype))
        save_hf_folder(model, folder, "llama", max_shard_bytes=shard_mb * 2**20)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--shard-mb", type=int, default=500)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--cache", default="/tmp/aiayn-load-memory")
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0
    folder = Path(args.cache) / f"llama-{args.size_gb:g}gb-{args.dtype}"
    on_disk = make(folder, args.size_gb, args.shard_mb, args.dtype)
    shards = len(list(folder.glob("*.safetensors")))
    print(f"{folder}: {on_disk / 1e9:.2f} GB in {shards} shards ({args.dtype})")
    results = {
        "folder": str(folder),
        "bytes_on_disk": on_disk,
        "shards": shards,
        "dtype": args.dtype,
    }
    for which in ("aiayn", "hf"):
        out = subprocess.run(
            [sys.executable, __file__, "--child", which, str(folder)],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["growth_over_weights"] = (r["peak"] - r["rss_before"]) / on_disk
        r["peak_over_weights"] = r["peak"] / on_disk
        results[which] = r
        print(
            f"{which:>6}: RSS before {r['rss_before'] / 1e9:.2f} GB, peak {r['peak'] / 1e9:.2f} GB"
            f" (growth {r['growth_over_weights']:.3f}x the weights, peak {r['peak_over_weights']:.3f}x),"
            f" {r['seconds']:.1f} s, {r['dtype']}"
        )
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
