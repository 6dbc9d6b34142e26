"""Softmax attention, linear attention and a selective SSM as the mixer of the same small GPT:
training step time, decoding time per token, and the decoding cache against the length.

    python benchmarks/mixers.py [--rounds 3] [--json benchmarks/results/mixers.json]

The models are configs/shakespeare_char.toml's (4 layers x 128, 65 characters) with
``mixer`` set; the state-space ones take a narrower feed-forward so that every model has
about 0.80M parameters (experiments/ssm.toml).  Every measurement runs in a fresh process,
the models interleaved round by round (benchmarks/rounds.py), same threads; the table gives
the median with the min-max and ratios to softmax attention measured in the same run.

* train: one AdamW step on 12 x 64 characters (the config's batch), after two warm-up steps.
* decode: ms per token generating 256 tokens after a 1-token prompt, batch 1, KV-cached.
* cache: the decoding cache's bytes after n tokens, n = 256 and 4,096 (counted exactly:
  ``Cache.nbytes()``), at context 4,096 (max_len raised; positions are learned, so the
  models are only run, not trained, at that length).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rounds import cell, child_main, host_rates, interleaved, rates_line, spread

ROOT = Path(__file__).resolve().parent.parent
MIXERS = {
    "softmax": {"mixer.kind": "attention", "ffn.d_ff": 512},
    "linear": {"mixer.kind": "linear", "ffn.d_ff": 512},
    "ssm": {"mixer.kind": "ssm", "ffn.d_ff": 360},
    "hybrid-ssm-1-in-4": {"mixer.kind": "ssm", "ffn.d_ff": 400, "mixer.attention_every": 4},
}


def _model(name: str, max_len: int = 64) -> Any:
    from aiayn.models import build_model
    from aiayn.training.config import load_run_config

    run = load_run_config(ROOT / "configs" / "shakespeare_char.toml")
    return build_model(run.model.replace(vocab_size=65, max_len=max_len, **MIXERS[name]))


def measure(case: dict[str, Any]) -> dict[str, float]:
    torch.manual_seed(0)
    name = case["model"]
    out: dict[str, float] = {}
    model = _model(name).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 65, (12, 65))
    times = []
    for i in range(7):
        t0 = time.perf_counter()
        model(x[:, :-1], targets=x[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    out["train_ms"] = 1000 * statistics.median(times)
    out["params"] = float(model.num_parameters())
    long = _model(name, max_len=4096).eval()
    with torch.no_grad():
        for n in (256, 4096):  # a cache sized for n tokens, filled with n tokens
            cache = long.new_cache(1, n)
            token = torch.zeros(1, 1, dtype=torch.long)
            t0 = time.perf_counter()
            for _ in range(n):
                token = long(token, cache=cache)[:, -1:].argmax(-1)
            if n == 256:
                out["decode_ms_per_token"] = 1000 * (time.perf_counter() - t0) / n
            out[f"cache_bytes_{n}"] = float(cache.nbytes())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "mixers.json"))
    args = ap.parse_args()
    rates = host_rates()
    print(rates_line(rates))
    threads = torch.get_num_threads()
    cases = [{"name": n, "model": n, "threads": threads} for n in MIXERS]
    got = interleaved(__file__, cases, args.rounds)
    table: dict[str, dict[str, Any]] = {}
    for n in MIXERS:
        if got[n]:
            table[n] = {k: spread([r[k] for r in got[n]]) for k in got[n][0]}
    base = table.get("softmax")
    print(
        f"{'mixer':<20}{'params':>9}{'train ms/step':>22}{'×':>6}{'decode ms/token':>20}{'×':>6}"
        f"{'cache @256':>12}{'cache @4096':>13}"
    )
    for n, t in table.items():
        r_train = t["train_ms"]["median"] / base["train_ms"]["median"] if base else float("nan")
        r_dec = (
            t["decode_ms_per_token"]["median"] / base["decode_ms_per_token"]["median"]
            if base
            else float("nan")
        )
        print(
            f"{n:<20}{t['params']['median']:>9.0f}{cell(t['train_ms'], '.1f'):>22}{r_train:>6.2f}"
            f"{cell(t['decode_ms_per_token'], '.2f'):>20}{r_dec:>6.2f}"
            f"{t['cache_bytes_256']['median'] / 2**10:>9.0f} KiB{t['cache_bytes_4096']['median'] / 2**10:>9.0f} KiB"
        )
    Path(args.json).write_text(
        json.dumps(
            {"host": rates, "threads": threads, "rounds": args.rounds, "results": table}, indent=1
        )
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    if not child_main(measure):
        sys.exit(main())
