"""Load on `aiayn serve`: throughput and latency under concurrency, against serving one request
at a time and against HF ``generate`` behind the same kind of endpoint.

    python benchmarks/serve.py [--requests 64] [--concurrency 1 4 16] [--json PATH]

The model is the 6-layer, 384-wide GPT of benchmarks/lm.py (65 characters, context 320), its
initial weights saved once as a checkpoint; what is measured is compute, not text quality.
Four servers, each in a fresh process on 127.0.0.1, run one after the other:

* ``aiayn``: ``aiayn serve`` with continuous batching (16 rows);
* ``aiayn:12``: the same with a 12-row pool (``--max-batch 12``): at 16 concurrent requests, 4
  wait in the queue while the others decode faster (a 16-row step on 2 cores reads more keys
  and values than a 12-row one), trading time to first token for time per token;
* ``aiayn-unbatched``: the same server with ``--no-batching`` (one request decodes at a time);
* ``hf``: a FastAPI endpoint (this file, ``--hf-server``) that runs HF GPT2LMHeadModel's
  ``generate`` with its KV cache, one request at a time, streaming through a ``BaseStreamer``;
  the weights are the same (aiayn.interop.hf).

For each server and concurrency C, a client keeps C streaming requests in flight until 64 are
done, from a fixed mixed set: prompts of 8-128 characters of Tiny Shakespeare (or fixed
text without the data), 32-128 new tokens, greedy.  Every server sees the same requests in the
same order.  Reported: generated tokens/s over the run, and p50/p99 of the time to first token
(TTFT) and of the time per output token after the first (TPOT), per request.  The work is fixed
(requests and tokens); only times are measured.
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
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rounds import host_rates, rates_line

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "serve.json"
SHAPE = dict(n_layers=6, n_heads=6, d_model=384, d_ff=1536, vocab_size=65, max_len=320)


def make_checkpoint(folder: Path, text: str) -> None:
    import aiayn
    from aiayn.checkpoint import save
    from aiayn.checkpoint.bundle import TOKENIZER_FILE
    from aiayn.data.tokenizer import CharTokenizer

    tok = CharTokenizer.from_text(text)
    torch.manual_seed(0)
    model = aiayn.build_model("gpt2-small", **{**SHAPE, "vocab_size": tok.vocab_size},
                              dropout=0.0, activation="gelu")  # fmt: skip
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

    from aiayn.checkpoint import load_bundle
    from aiayn.interop.hf import to_hf_gpt2

    bundle = load_bundle(checkpoint)
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
                model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=body["max_tokens"], min_new_tokens=body["max_tokens"],
                               pad_token_id=0, streamer=Streamer(loop, queue))  # fmt: skip

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
    tokens = sum(r["tokens"] for r in results)

    def pct(key: str, q: float) -> float:
        values = sorted(r[key] for r in results)
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]

    return {"concurrency": concurrency, "requests": len(results), "tokens": tokens,
            "wall_s": wall, "tok_s": tokens / wall, "client_cpu_s": cpu,
            "ttft_p50_ms": 1000 * pct("ttft", 0.5), "ttft_p99_ms": 1000 * pct("ttft", 0.99),
            "tpot_p50_ms": 1000 * pct("tpot", 0.5), "tpot_p99_ms": 1000 * pct("tpot", 0.99),
            "tpot_mean_ms": 1000 * statistics.mean(r["tpot"] for r in results)}  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(kind: str, checkpoint: Path, threads: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if kind == "hf":
        cmd = [sys.executable, __file__, "--hf-server", str(checkpoint), "--port", str(port)]
    else:
        rows = kind.split(":")[1] if ":" in kind else "16"
        cmd = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(checkpoint),
               "--port", str(port), "--max-batch", rows, "--max-queue", "256",
               "--log-level", "warning", "--device", "cpu"]  # fmt: skip
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


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--servers", nargs="+", default=["aiayn", "aiayn:12", "aiayn-unbatched", "hf"])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--data", default=None)
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--hf-server", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.hf_server:
        hf_server(args.hf_server, args.port)
        return 0
    from aiayn.data.files import data_dir

    try:
        text = (data_dir(args.data) / "tinyshakespeare" / "input.txt").read_text()
    except (OSError, ValueError):
        text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 200
    rates = host_rates()
    print(rates_line(rates), flush=True)
    requests = workload(text, args.requests)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        make_checkpoint(checkpoint, text)
        for kind in args.servers:
            proc, url = start(kind, checkpoint, args.threads)
            try:
                asyncio.run(load(url, requests[:4], 2))  # warm-up
                for c in args.concurrency:
                    got = asyncio.run(load(url, requests, c))
                    results[f"{kind}@{c}"] = got
                    print(f"{kind:>16} c={c:<3} {got['tok_s']:8.1f} tok/s  TTFT p50/p99 "
                          f"{got['ttft_p50_ms']:7.1f}/{got['ttft_p99_ms']:7.1f} ms  TPOT p50/p99 "
                          f"{got['tpot_p50_ms']:6.2f}/{got['tpot_p99_ms']:6.2f} ms  client CPU {got['client_cpu_s']:.2f} s of {got['wall_s']:.2f} s", flush=True)  # fmt: skip
            finally:
                proc.terminate()
                proc.wait(30)
    print(f"\n{'server':>16} {'C':>3} {'tok/s':>9} {'× unbatched':>12} {'× hf':>6} "
          f"{'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>17} {'p99 TPOT / lone':>16}")  # fmt: skip
    lone = results.get("aiayn@1", {}).get("tpot_p50_ms")
    for key, r in results.items():
        kind, c = key.split("@")
        base = results.get(f"aiayn-unbatched@{c}", {}).get("tok_s")
        hf = results.get(f"hf@{c}", {}).get("tok_s")
        print(f"{kind:>16} {c:>3} {r['tok_s']:9.1f} {r['tok_s'] / base if base else float('nan'):12.2f}"
              f" {r['tok_s'] / hf if hf else float('nan'):6.2f}"
              f" {r['ttft_p50_ms']:8.1f}/{r['ttft_p99_ms']:8.1f} {r['tpot_p50_ms']:8.2f}/{r['tpot_p99_ms']:8.2f}"
              f" {r['tpot_p99_ms'] / lone if lone else float('nan'):16.2f}")  # fmt: skip
    out = {"host": rates, "threads": args.threads, "shape": SHAPE, "requests": args.requests,
           "results": results}  # fmt: skip
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
