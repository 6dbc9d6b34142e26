"""`aiayn serve` under hostile load: locust's users mixing valid requests with malformed ones,
oversized ones and clients that leave mid-stream.

    python benchmarks/serve_load.py [--users 200] [--seconds 60] [--json PATH]

The server is ``aiayn serve`` in a process of its own, on a checkpoint of a 4-layer, 256-wide
character-level GPT (initial weights: what is measured is the server, not text quality), with
``--max-queue 512`` so that every valid request is queued rather than refused, and
``--max-body 65536``.  locust runs headless in another process (this file is its locustfile):
``--users`` users, each picking a request by weight and pausing 0.5-2 s between requests:

=====================  ======  ==========================================================
request                weight  expected answer
=====================  ======  ==========================================================
valid: completion      6       200 with one choice (prompts of 8-64 characters, 8-24 new
                               tokens, greedy or sampled)
valid: stream          3       200, server-sent events ending ``data: [DONE]``
malformed: JSON        1       400 (a body that is not JSON)
malformed: values      1       400 (a negative temperature, a stop string over the limit)
oversized: body        1       413 (a 128 KiB prompt), refused before it is read
leaves mid-stream      1       200; the client reads one event and closes the connection
=====================  ======  ==========================================================

Reported: requests answered per kind, every 5xx (the target is none), failures (an answer
other than the one expected), p50/p99 latency of the valid requests, and the server's resident
memory (RSS) idle, after a warm-up load (the same users for a quarter of the time, not
counted) and at the end: what grows after the warm-up is what a leak would be (the target: at
most 10 %).  The matmul rate
and the CPU's flags are printed beside them; the figures go to ``--json``
(benchmarks/results/serve_load.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "serve_load.json"
SHAPE = {"n_layers": 4, "attention.n_heads": 4, "d_model": 256, "ffn.d_ff": 1024, "max_len": 256}
TEXT = "the quick brown fox jumps over the lazy dog. " * 4
VALID = ("valid: completion", "valid: stream")

if os.environ.get("AIAYN_LOCUSTFILE"):  # imported by locust: the users
    from collections import Counter

    from locust import HttpUser, between, events, task

    FAILURES: Counter[str] = Counter()  # "kind: message" -> count, written when locust quits

    @events.request.add_listener
    def _count(name: str, exception: BaseException | None, **_: Any) -> None:
        if exception is not None:
            FAILURES[f"{name}: {exception}"] += 1

    @events.quitting.add_listener
    def _write(**_: Any) -> None:
        Path(os.environ["AIAYN_LOCUSTFILE"]).write_text(json.dumps(FAILURES))

    class Client(HttpUser):
        """One user: a request drawn by weight (module docstring), then a pause."""

        wait_time = between(0.5, 2.0)

        def _expect(self, name: str, status: int, **kw: Any) -> Any:
            with self.client.post("/v1/completions", name=name, catch_response=True, **kw) as r:
                if r.status_code >= 500:
                    r.failure(f"5xx: {r.status_code}")
                elif r.status_code != status:
                    r.failure(f"expected {status}, got {r.status_code}")
                else:
                    r.success()
                return r

        def _prompt(self) -> dict[str, Any]:
            start, length = random.randrange(0, 100), random.randint(8, 64)
            body = {"prompt": TEXT[start : start + length], "max_tokens": random.randint(8, 24)}
            return {**body, "temperature": random.choice([0, 0.8]), "seed": random.randrange(99)}

        @task(6)
        def completion(self) -> None:
            self._expect("valid: completion", 200, json=self._prompt())

        @task(3)
        def stream(self) -> None:
            r = self._expect("valid: stream", 200, json={**self._prompt(), "stream": True})
            if r.status_code == 200 and not r.text.rstrip().endswith("data: [DONE]"):
                r.failure("the stream did not end with [DONE]")

        @task(1)
        def malformed_json(self) -> None:
            headers = {"Content-Type": "application/json"}
            self._expect("malformed: JSON", 400, data=b'{"prompt": "a", ', headers=headers)

        @task(1)
        def malformed_values(self) -> None:
            bad = random.choice([{"temperature": -1}, {"stop": "x" * 5000}, {"max_tokens": 0}])
            self._expect("malformed: values", 400, json={"prompt": "the", **bad})

        @task(1)
        def oversized(self) -> None:
            self._expect("oversized: body", 413, json={"prompt": "a" * (128 * 1024)})

        @task(1)
        def leaves(self) -> None:
            body = {**self._prompt(), "max_tokens": 64, "stream": True}
            name = "leaves mid-stream"
            with self.client.post(
                "/v1/completions", name=name, json=body, stream=True, catch_response=True
            ) as r:
                if r.status_code != 200:
                    r.failure(f"expected 200, got {r.status_code}")
                    return
                next(r.iter_lines())  # the first event; then the connection is closed
                r.success()
                r.close()


def make_checkpoint(folder: Path) -> None:
    import torch

    import aiayn
    from aiayn.checkpoint import save
    from aiayn.checkpoint.bundle import TOKENIZER_FILE
    from aiayn.data.tokenizer import CharTokenizer

    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = aiayn.build_model("gpt2-small", **SHAPE, vocab_size=tok.vocab_size, dropout=0.0)
    save(model, folder)
    tok.save(folder / TOKENIZER_FILE)


def rss_mb(pid: int) -> dict[str, float]:
    """The process's resident memory now and at its peak (``/proc``), in MB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {key: int(fields[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(checkpoint: Path, port: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(checkpoint)]
    argv += ["--port", str(port), "--max-queue", "512", "--max-body", "65536"]
    server = subprocess.Popen([*argv, "--log-level", "warning"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("aiayn serve did not start in 120 s")


def warm_up(url: str) -> None:
    import urllib.request

    for n in (8, 16):
        body = json.dumps({"prompt": TEXT[:32], "max_tokens": n, "temperature": 0}).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(f"{url}/v1/completions", body, headers)
        with urllib.request.urlopen(request, timeout=120) as answer:
            answer.read()


def run_locust(url: str, users: int, seconds: int, out: Path) -> None:
    """locust, headless, in a process of its own: its final stats go to ``out/stats.json``,
    the failures by kind and message to ``out/failures.json``."""
    argv = [sys.executable, "-m", "locust", "-f", __file__, "--headless", "--host", url]
    argv += ["-u", str(users), "-r", str(max(1, users // 10)), "-t", f"{seconds}s"]
    argv += ["--json-file", str(out / "stats"), "--only-summary", "--stop-timeout", "30"]
    env = {**os.environ, "AIAYN_LOCUSTFILE": str(out / "failures.json")}
    subprocess.run([*argv, "--loglevel", "ERROR"], env=env, check=False, capture_output=True)


def percentile(histogram: dict[str, int], q: float) -> float:
    """The ``q`` quantile of locust's response-time histogram (ms -> count)."""
    times = sorted((float(ms), n) for ms, n in histogram.items())
    total, seen = sum(n for _, n in times), 0
    for ms, n in times:
        seen += n
        if seen >= q * total:
            return ms
    return float("nan")


def read_stats(out: Path) -> dict[str, dict[str, Any]]:
    """Per request kind: requests answered, failures, p50 and p99 latency (ms)."""
    return {
        entry["name"]: {
            "requests": entry["num_requests"],
            "failures": entry["num_failures"],
            "p50_ms": percentile(entry["response_times"], 0.50),
            "p99_ms": percentile(entry["response_times"], 0.99),
        }
        for entry in json.loads((out / "stats.json").read_text())
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=200)
    p.add_argument("--seconds", type=int, default=60)
    p.add_argument("--json", type=Path, default=RESULTS)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from rounds import host_rates, rates_line

    from aiayn.device import cpu_flags

    rates = host_rates()
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))
    print(f"# {rates_line(rates)}; {os.cpu_count()} cores; flags: {' '.join(flags)}")
    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp) / "ckpt")
        port = free_port()
        server = start_server(Path(tmp) / "ckpt", port)
        try:
            url = f"http://127.0.0.1:{port}"
            warm_up(url)
            start = rss_mb(server.pid)
            # The same load for a quarter of the time first: the server's thread pools, the
            # allocator's arenas and the engine's caches reach their working size, so that
            # what grows after it is what a leak would be.
            (Path(tmp) / "warm").mkdir()
            run_locust(url, args.users, max(5, args.seconds // 4), Path(tmp) / "warm")
            before = rss_mb(server.pid)
            run_locust(url, args.users, args.seconds, Path(tmp))
            after = rss_mb(server.pid)
            alive = server.poll() is None
        finally:
            server.terminate()
            server.wait(60)
        stats = read_stats(Path(tmp))
        failures = json.loads((Path(tmp) / "failures.json").read_text())
    report(args, rates, flags, stats, failures, (start, before, after), alive)


def report(
    args: argparse.Namespace,
    rates: dict[str, float],
    flags: list[str],
    stats: dict[str, dict[str, Any]],
    failures: dict[str, int],
    memory: tuple[dict[str, float], ...],
    alive: bool,
) -> None:
    """Print the table and write the JSON; ``memory`` is the server's RSS after two requests,
    after the warm-up load and at the end."""
    start, before, after = memory
    errors_5xx = sum(n for key, n in failures.items() if ": 5xx" in key)
    growth = after["VmRSS"] / before["VmRSS"] - 1
    print(f"{'request':<20} {'answered':>9} {'failed':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for name, s in sorted(stats.items()):
        row = f"{name:<20} {s['requests']:>9} {s['failures']:>7}"
        print(f"{row} {s['p50_ms']:>8.0f} {s['p99_ms']:>8.0f}")
    for key, n in sorted(failures.items()):
        print(f"  failure x{n}: {key}")
    print(f"5xx: {errors_5xx}; server alive at the end: {alive}")
    print(
        f"server RSS {start['VmRSS']:.0f} MB idle, {before['VmRSS']:.0f} MB after the warm-up"
        f" load -> {after['VmRSS']:.0f} MB at the end ({growth:+.1%}); peak"
        f" {after['VmHWM']:.0f} MB"
    )
    result = {
        "users": args.users,
        "seconds": args.seconds,
        "host": {**rates, "cores": os.cpu_count(), "flags": flags},
        "requests": stats,
        "failures": failures,
        "errors_5xx": errors_5xx,
        "valid_failures": sum(stats[n]["failures"] for n in VALID if n in stats),
        "rss_mb": {
            "idle": start["VmRSS"],
            "after_warm_up": before["VmRSS"],
            "end": after["VmRSS"],
            "growth": growth,
        },
        "peak_rss_mb": after["VmHWM"],
        "server_alive": alive,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(args.json)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
