"""Load on `aiayn serve`: throughput and latency under concurrency, against serving one request
at a time and against HF ``generate`` behind the same kind of endpoint.

    python benchmarks/serve.py [--requests 64] [--concurrency 1 4 16] [--rounds 3] [--json PATH]

The model is the 6-layer, 384-wide GPT of benchmarks/lm.py (65 characters, context 320), its
initial weights saved once as a checkpoint; what is measured is compute, not text quality.
Four servers, each a process of its own on 127.0.0.1, all started before the first load:

* ``aiayn``: ``aiayn serve`` with continuous batching (16 rows);
* ``aiayn:12``: the same with a 12-row pool (``--max-batch 12``): at 16 concurrent requests, 4
  wait in the queue while the others decode faster (a 16-row step on 2 cores reads more keys
  and values than a 12-row one), trading time to first token for time per token;
* ``aiayn-unbatched``: the same server with ``--no-batching`` (one request decodes at a time);
* ``hf``: a FastAPI endpoint (this file, ``--hf-server``) that runs HF GPT2LMHeadModel's
  ``generate`` with its KV cache, one request at a time, streaming through a ``BaseStreamer``;
  the weights are the same (aiayn.interop.gpt2).

``--baseline REF`` adds a fifth: ``aiayn serve`` as it was at git REF (``git archive``, run
with ``PYTHONPATH`` ahead of the installed package), and each server's tokens/s over it -- how
a change moved the server's speed, measured in the same rounds.

For each server and concurrency C, a client keeps C streaming requests in flight until 64 are
done, from a fixed mixed set: prompts of 8-128 characters of Tiny Shakespeare (or fixed
text without the data), 32-128 new tokens, greedy.  Every server sees the same requests in the
same order.  Reported: generated tokens/s over the run, and p50/p99 of the time to first token
(TTFT) and of the time per output token after the first (TPOT), per request.  The work is fixed
(requests and tokens); only times are measured.

The runs are interleaved: each of ``--rounds`` rounds runs every server at every concurrency,
the servers' order rotated per round, and the ratios the targets are stated in (tokens/s
against serving one at a time and against HF; p99 TPOT against a lone request's) are taken
within a round, then reported as the median with min-max over the rounds.  This host's speed
drifts by up to 2x from hour to hour; a ratio between two runs ten minutes apart does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rounds import cell, host_rates, rates_line, spread

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "serve.json"
SHAPE = {
    "n_layers": 6,
    "attention.n_heads": 6,
    "d_model": 384,
    "ffn.d_ff": 1536,
    "vocab_size": 65,
    "max_len": 320,
}


def make_checkpoint(folder: Path, text: str) -> None:
    import aiayn
    from aiayn.checkpoint import save
    from aiayn.checkpoint.bundle import TOKENIZER_FILE
    from aiayn.data.tokenizer import CharTokenizer

    tok = CharTokenizer.from_text(text)
    torch.manual_seed(0)
    model = aiayn.build_model(
        "gpt2-small",
        **{**SHAPE, "vocab_size": tok.vocab_size},
        dropout=0.0,
        ffn={"activation": "gelu"},
    )
    save(model, folder)
    tok.save(folder / TOKENIZER_FILE)


def workload(text: str, n: int) -> list[dict[str, Any]]:
    """``n`` requests: prompts of 8-128 characters from ``text``, 32-128 new tokens, greedy."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        length = int(torch.randint(8, 129, (1,), generator=g))
        start = int(torch.randint(0, len(text) - length, (1,), generator=g))
        new = int(torch.randint(32, 129, (1,), generator=g))
        out.append({"prompt": text[start : start + length], "max_tokens": new, "temperature": 0})
    return out


# ----- the HF peer: a FastAPI endpoint around `generate`, one request at a time ---------------


def hf_server(checkpoint: str, port: int) -> None:
    import threading

    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from transformers.generation.streamers import BaseStreamer

    from aiayn.checkpoint import load
    from aiayn.interop.gpt2 import to_hf_gpt2

    bundle = load(checkpoint)
    model = to_hf_gpt2(bundle.model.eval(), attn_implementation="sdpa").eval()  # type: ignore[arg-type]
    tok = bundle.tokenizer
    lock = threading.Lock()
    app = FastAPI()

    class Streamer(BaseStreamer):
        def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
            self.loop, self.queue, self.prompt_seen = loop, queue, False

        def put(self, value: torch.Tensor) -> None:
            if not self.prompt_seen:  # generate() puts the prompt first
                self.prompt_seen = True
                return
            for t in value.reshape(-1).tolist():
                self.loop.call_soon_threadsafe(self.queue.put_nowait, int(t))

        def end(self) -> None:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, None)

    @app.post("/v1/completions")
    async def complete(body: dict[str, Any]) -> StreamingResponse:
        ids = torch.tensor([tok.encode(body["prompt"])])
        loop, queue = asyncio.get_running_loop(), asyncio.Queue()

        def run() -> None:
            with lock, torch.no_grad():
                model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=body["max_tokens"],
                    min_new_tokens=body["max_tokens"],
                    pad_token_id=0,
                    streamer=Streamer(loop, queue),
                )

        task = asyncio.get_running_loop().run_in_executor(None, run)

        async def sse():  # type: ignore[no-untyped-def]
            while (token := await queue.get()) is not None:
                chunk = {"choices": [{"text": tok.decode([token]), "index": 0}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            await task
            yield "data: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ----- the client -----------------------------------------------------------------------------


async def one(client: Any, url: str, body: dict[str, Any]) -> dict[str, float]:
    t0 = time.perf_counter()
    stamps: list[float] = []
    async with client.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {await r.aread()!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"][0].get("text"):
                    stamps.append(time.perf_counter())
    tokens = body["max_tokens"]
    ttft = stamps[0] - t0
    tpot = (stamps[-1] - stamps[0]) / max(1, tokens - 1)
    return {"ttft": ttft, "tpot": tpot, "tokens": tokens}


async def load(url: str, requests: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    import httpx2 as httpx

    queue = list(requests)
    results: list[dict[str, float]] = []
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker() -> None:
            while queue:
                results.append(await one(client, url, queue.pop(0)))

        t0, cpu0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return _summary(concurrency, results, wall, cpu)


# ----- in process: the engine itself, without HTTP ---------------------------------------------

# In-process variants: the engine as `aiayn serve` runs it (ragged attention); with the
# attention of a decoding step padded to the longest row, as before; with a bf16 KV cache;
# with int8 weights; with both (`aiayn serve --quantize int8 --kv-cache-dtype bfloat16`).
ENGINES = ("aiayn", "aiayn-padded", "aiayn-bf16kv", "aiayn-int8", "aiayn-int8-bf16kv")


def engine_load(model: Any, tok: Any, work: list[dict[str, Any]], c: int) -> dict[str, Any]:
    """One load on a fresh in-process Engine (16 rows), run in this thread -- the main one, as
    `aiayn serve` runs it -- while another thread keeps ``c`` requests in flight; the metrics
    of :func:`load`, from the engine's own token events."""
    import threading

    from aiayn.generate.sampling import SamplingConfig
    from aiayn.serve.engine import Engine, Request

    engine = Engine(model, tok.decode, max_batch=16, max_queue=256)
    gate, lock = threading.Semaphore(c), threading.Lock()
    stamps: dict[int, list[float]] = {}
    left = [len(work)]

    def emit(i: int, event: Any) -> None:
        if event.kind == "token":
            stamps[i].append(time.perf_counter())
        elif event.kind in ("done", "error"):
            gate.release()
            with lock:
                left[0] -= 1
                if not left[0]:
                    engine.stop(wait=False)

    def drive() -> None:
        for i, body in enumerate(work):
            gate.acquire()
            stamps[i] = [time.perf_counter()]
            engine.submit(
                Request(
                    tok.encode(body["prompt"]),
                    body["max_tokens"],
                    SamplingConfig(temperature=0),
                    emit=partial(emit, i),
                )
            )

    t0 = time.perf_counter()
    threading.Thread(target=drive, daemon=True).start()
    engine.run()  # until the last request is done
    wall = time.perf_counter() - t0
    per = [
        {
            "ttft": st[1] - st[0],
            "tpot": (st[-1] - st[1]) / max(1, len(st) - 2),
            "tokens": len(st) - 1,
        }
        for st in stamps.values()
    ]
    return _summary(c, per, wall, 0.0)


def engine_child(
    variant: str, checkpoint: str, requests: list[dict[str, Any]], concurrencies: list[int]
) -> list[dict[str, Any]]:
    """Every concurrency's :func:`engine_load` for one variant, after a warm-up load."""
    import aiayn
    from aiayn.models.precision import Precision, apply_precision
    from aiayn.serve import slots

    if variant == "aiayn-padded":
        slots.ragged_groups = lambda keys: ((0, len(keys), max(keys)),)  # type: ignore[assignment]
    bundle = aiayn.load(checkpoint)
    precision = Precision(
        kv_cache="bfloat16" if variant.endswith("bf16kv") else None,
        quantize="int8" if "int8" in variant else None,
    )
    model = apply_precision(bundle.model, torch.device("cpu"), precision)
    engine_load(model, bundle.tokenizer, requests[:4], 2)  # warm-up
    return [engine_load(model, bundle.tokenizer, requests, c) for c in concurrencies]


def _summary(c: int, results: list[dict[str, float]], wall: float, cpu: float) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in results)

    def pct(key: str, q: float) -> float:
        values = sorted(r[key] for r in results)
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]

    return {
        "concurrency": c,
        "requests": len(results),
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "client_cpu_s": cpu,
        "ttft_p50_ms": 1000 * pct("ttft", 0.5),
        "ttft_p99_ms": 1000 * pct("ttft", 0.99),
        "tpot_p50_ms": 1000 * pct("tpot", 0.5),
        "tpot_p99_ms": 1000 * pct("tpot", 0.99),
        "tpot_mean_ms": 1000 * statistics.mean(r["tpot"] for r in results),
    }


def run_engine(
    variant: str,
    checkpoint: Path,
    requests: list[dict[str, Any]],
    concurrencies: list[int],
    threads: int,
) -> list[dict[str, Any]]:
    """:func:`engine_child` in a fresh process (its own allocator, caches and threads)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    job = json.dumps(
        {
            "variant": variant,
            "checkpoint": str(checkpoint),
            "requests": requests,
            "concurrency": concurrencies,
        }
    )
    done = subprocess.run(
        [sys.executable, __file__, "--engine-child", job],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export_tree(ref: str, into: Path) -> Path:
    """The ``aiayn`` package as it was at git ``ref`` (``git archive``), under ``into``: a
    baseline server runs it with ``PYTHONPATH`` ahead of the installed one."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "aiayn"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def start(
    kind: str, checkpoint: Path, threads: int, baseline: Path | None = None
) -> tuple[subprocess.Popen, str]:
    """A server of ``kind``: "hf", "aiayn" (":ROWS"), "aiayn-unbatched", or "baseline" (aiayn
    serve from the tree ``baseline``)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if kind == "baseline":
        assert baseline is not None, "--baseline REF names the tree"
        env["PYTHONPATH"] = str(baseline)
    if kind == "hf":
        cmd = [sys.executable, __file__, "--hf-server", str(checkpoint), "--port", str(port)]
    else:
        rows = kind.split(":")[1] if ":" in kind else "16"
        cmd = [
            sys.executable,
            "-m",
            "aiayn",
            "serve",
            "--checkpoint",
            str(checkpoint),
            "--port",
            str(port),
            "--max-batch",
            rows,
            "--max-queue",
            "256",
            "--log-level",
            "warning",
            "--device",
            "cpu",
        ]
        if kind == "aiayn-unbatched":
            cmd.append("--no-batching")
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    import httpx2 as httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"the {kind} server did not start")


METRICS = ("tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "tpot_mean_ms")


def ratios(runs: dict[str, list[dict[str, Any]]], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Per server and concurrency, the ratios the targets are stated in, each taken within one
    round (the host's speed drifts between rounds, not within one): tokens/s over the
    unbatched server's and over HF's at the same concurrency, and p99 TPOT over the lone
    request's (aiayn at concurrency 1, its p50)."""
    out: dict[str, dict[str, list[float]]] = {}
    for key, got in runs.items():
        c = key.split("@")[1]
        pairs = {
            "x_unbatched": (f"aiayn-unbatched@{c}", "tok_s", "tok_s"),
            "x_hf": (f"hf@{c}", "tok_s", "tok_s"),
            "x_baseline": (f"baseline@{c}", "tok_s", "tok_s"),
            "p99_tpot_over_lone": ("aiayn@1", "tpot_p99_ms", "tpot_p50_ms"),
        }
        out[key] = {}
        for name, (peer, mine, theirs) in pairs.items():
            if peer in runs:
                out[key][name] = [got[r][mine] / runs[peer][r][theirs] for r in range(rounds)]
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--servers", nargs="+", default=["aiayn", "aiayn:12", "aiayn-unbatched", "hf"])
    ap.add_argument("--rounds", type=int, default=3, help="load runs per server and concurrency")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--data", default=None)
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="REF",
        help="also serve aiayn as it was at git REF (server 'baseline'): tokens/s of"
        " each server over it, within each round",
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="the engine in-process, without HTTP: ragged attention, attention padded"
        " to the longest row, and a bf16 KV cache (JSON: serve_in_process.json)",
    )
    ap.add_argument("--engine-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--hf-server", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return ap


def _run_child(args: argparse.Namespace) -> bool:
    """Run this process as one of the run's servers (``--hf-server``, ``--engine-child``),
    if it is one."""
    if args.hf_server:
        hf_server(args.hf_server, args.port)
        return True
    if args.engine_child:
        job = json.loads(args.engine_child)
        got = engine_child(job["variant"], job["checkpoint"], job["requests"], job["concurrency"])
        print(json.dumps(got))
        return True
    return False


def _text(data: str | None) -> str:
    """Tiny Shakespeare from the data folder, or a fixed text without it."""
    from aiayn.data.files import data_dir

    try:
        return (data_dir(data) / "tinyshakespeare" / "input.txt").read_text()
    except (OSError, ValueError):
        return "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200


def main() -> int:
    args = _parser().parse_args()
    if _run_child(args):
        return 0
    text = _text(args.data)
    rates = [host_rates()]
    print(rates_line(rates[0]), flush=True)
    requests = workload(text, args.requests)
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        make_checkpoint(checkpoint, text)
        # Every server is up for the whole run (idle ones wait on a lock and use no CPU), and
        # each round runs them all, in an order rotated per round: a ratio is then taken
        # between runs minutes apart, not between a fast and a slow hour of the host.
        if args.in_process:
            return in_process(args, checkpoint, requests, rates)
        servers: dict[str, tuple[subprocess.Popen, str]] = {}
        baseline = None
        if args.baseline:
            baseline = export_tree(args.baseline, Path(tmp) / "baseline")
            args.servers = [*args.servers, "baseline"]
        try:
            for kind in args.servers:
                servers[kind] = start(kind, checkpoint, args.threads, baseline)
                asyncio.run(load(servers[kind][1], requests[:4], 2))  # warm-up
            for r in range(args.rounds):
                shift = r % len(args.servers)
                for kind in args.servers[shift:] + args.servers[:shift]:
                    for c in args.concurrency:
                        got = asyncio.run(load(servers[kind][1], requests, c))
                        runs.setdefault(f"{kind}@{c}", []).append(got)
                        print(
                            f"round {r + 1} {kind:>16} c={c:<3} {got['tok_s']:8.1f} tok/s  TTFT p50/p99 "
                            f"{got['ttft_p50_ms']:7.1f}/{got['ttft_p99_ms']:7.1f} ms  TPOT p50/p99 "
                            f"{got['tpot_p50_ms']:6.2f}/{got['tpot_p99_ms']:6.2f} ms  client CPU {got['client_cpu_s']:.2f} s of {got['wall_s']:.2f} s",
                            flush=True,
                        )
        finally:
            for proc, _ in servers.values():
                proc.terminate()
            for proc, _ in servers.values():
                proc.wait(30)
    rates.append(host_rates())
    print(rates_line(rates[1]), flush=True)
    within = ratios(runs, args.rounds)
    results = {
        key: {
            "concurrency": got[0]["concurrency"],
            "requests": got[0]["requests"],
            "tokens": got[0]["tokens"],
            "rounds": got,
            **{m: spread([g[m] for g in got]) for m in METRICS},
            **{name: spread(v) for name, v in within[key].items()},
        }
        for key, got in runs.items()
    }
    print(f"\nmedians over {args.rounds} rounds (min-max); ratios taken within each round")
    print(
        f"{'server':>16} {'C':>3} {'tok/s':>17} {'× unbatched':>17} {'× hf':>17} "
        f"{'× baseline':>19} {'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>16} {'p99 TPOT / lone':>17}"
    )
    nan = {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    for key, row in results.items():
        kind, c = key.split("@")
        print(
            f"{kind:>16} {c:>3} {cell(row['tok_s']):>17} {cell(row.get('x_unbatched', nan), '.2f'):>17}"
            f" {cell(row.get('x_hf', nan), '.2f'):>17} {cell(row.get('x_baseline', nan), '.3f'):>19}"
            f" {row['ttft_p50_ms']['median']:8.1f}/{row['ttft_p99_ms']['median']:8.1f}"
            f" {row['tpot_p50_ms']['median']:7.2f}/{row['tpot_p99_ms']['median']:7.2f}"
            f" {cell(row.get('p99_tpot_over_lone', nan), '.2f'):>17}"
        )
    out = {
        "host": rates,
        "threads": args.threads,
        "shape": SHAPE,
        "requests": args.requests,
        "rounds": args.rounds,
        "baseline": args.baseline,
        "results": results,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
    return 0


def in_process(
    args: argparse.Namespace,
    checkpoint: Path,
    requests: list[dict[str, Any]],
    rates: list[dict[str, float]],
) -> int:
    """The in-process table: every engine variant at every concurrency, a fresh process per
    variant and round, the variants' order rotated per round; p99 TPOT over the lone request's
    (the same variant at concurrency 1, its p50) within each round."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(args.rounds):
        shift = r % len(ENGINES)
        for variant in ENGINES[shift:] + ENGINES[:shift]:
            for got in run_engine(variant, checkpoint, requests, args.concurrency, args.threads):
                runs.setdefault(f"{variant}@{got['concurrency']}", []).append(got)
                print(
                    f"round {r + 1} {variant:>14} c={got['concurrency']:<3} {got['tok_s']:8.1f} tok/s"
                    f"  TTFT p50/p99 {got['ttft_p50_ms']:7.1f}/{got['ttft_p99_ms']:7.1f} ms  TPOT"
                    f" p50/p99 {got['tpot_p50_ms']:6.2f}/{got['tpot_p99_ms']:6.2f} ms",
                    flush=True,
                )
    rates.append(host_rates())
    print(rates_line(rates[1]), flush=True)
    results = {}
    for key, got in runs.items():
        variant = key.split("@")[0]
        lone = runs[f"{variant}@1"]
        over = [g["tpot_p99_ms"] / lone[i]["tpot_p50_ms"] for i, g in enumerate(got)]
        results[key] = {
            "rounds": got,
            **{m: spread([g[m] for g in got]) for m in METRICS},
            "p99_tpot_over_lone": spread(over),
        }
    print(f"\nin process, medians over {args.rounds} rounds (min-max)")
    print(f"{'engine':>14} {'C':>3} {'tok/s':>17} {'TPOT p50/p99 ms':>17} {'p99 TPOT / lone':>17}")
    for key, row in results.items():
        variant, c = key.split("@")
        print(
            f"{variant:>14} {c:>3} {cell(row['tok_s']):>17}"
            f" {row['tpot_p50_ms']['median']:8.2f}/{row['tpot_p99_ms']['median']:7.2f}"
            f" {cell(row['p99_tpot_over_lone'], '.2f'):>17}"
        )
    path = Path(args.json).with_name("serve_in_process.json")
    path.write_text(
        json.dumps(
            {
                "host": rates,
                "threads": args.threads,
                "shape": SHAPE,
                "requests": args.requests,
                "rounds": args.rounds,
                "results": results,
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
