"""Commands that serve: the HTTP API (serve) and the browser explorer (explore)."""

from __future__ import annotations

import argparse
import os
import sys

from aiayn.cli.common import _add_device, _add_precision
from aiayn.config import presets
from aiayn.errors import UserError
from aiayn.interop.generation_config import generation_of
from aiayn.serve.limits import DEFAULT_MAX_BODY, MAX_N, MAX_STOP_CHARS

KEY_VAR = "AIAYN_API_KEY"


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a checkpoint over HTTP with continuous batching (aiayn/serve/): the engine runs
    in this (main) thread, the HTTP server in another, and Ctrl-C or SIGTERM stops both
    (aiayn/serve/server.py)."""
    from aiayn.checkpoint import load
    from aiayn.cli.loading import _device, _precision
    from aiayn.interop.sentence_transformers import read_pooling
    from aiayn.models.precision import apply_precision
    from aiayn.serve.app import create_app
    from aiayn.serve.server import run_server

    bundle = load(args.checkpoint)
    model = apply_precision(bundle.model, _device(args), _precision(args))
    app = create_app(
        model,
        bundle.tokenizer,
        name=args.name or bundle.directory.resolve().parent.name,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens,
        prefill_chunk=args.prefill_chunk,
        batching=not args.no_batching,
        start_engine=False,
        context=args.context,
        generation=generation_of(bundle.run),
        pooling=read_pooling(args.checkpoint),
        api_key=_api_key(args.api_key),
        max_body=args.max_body,
        max_stop_chars=args.max_stop_chars,
        max_n=args.max_n,
    )
    run_server(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        label=str(bundle.directory),
        allowed_hosts=args.allowed_host,
    )
    return 0


def _api_key(given: str | None) -> str | None:
    """``--api-key``, else ``$AIAYN_API_KEY``, else None (an open server).  An empty key is
    refused: it would otherwise serve openly while looking protected."""
    key, source = (given, "--api-key") if given is not None else (os.environ.get(KEY_VAR), KEY_VAR)
    if key is not None and not key.strip():
        raise UserError(f"{source} is empty: give a key, or leave it unset to serve without one")
    return key


def cmd_explore(args: argparse.Namespace) -> int:
    """Serve the browser explorer on ``--host``:``--port``."""
    from aiayn.cli.loading import _device
    from aiayn.explore.registry import default_registry
    from aiayn.explore.server import serve

    registry = default_registry(args.checkpoint, args.runs, args.preset, device=_device(args))
    print(f"models: {', '.join(registry.entries)}", file=sys.stderr)
    print(f"open http://{args.host}:{args.port}/", file=sys.stderr)
    serve(
        registry,
        host=args.host,
        port=args.port,
        max_chars=args.max_chars,
        max_body=args.max_body,
        allowed_hosts=args.allowed_host,
    )
    return 0


def _add_allowed_host(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="answer requests whose Host header is NAME (repeatable); bound to a loopback"
        " address the server answers only localhost names and these (DNS rebinding)",
    )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register serve, explore."""
    p = sub.add_parser(
        "explore", help="a local web app: attention, next tokens, translations, lessons"
    )
    p.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="a checkpoint folder to offer, optionally named (repeatable)",
    )
    p.add_argument(
        "--runs", action="append", default=[], metavar="DIR", help="offer every checkpoint in DIR"
    )
    p.add_argument(
        "--preset",
        action="append",
        default=[],
        help=f"offer an untrained preset (repeatable): {', '.join(presets())}",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    _add_allowed_host(p)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-chars", type=int, default=400, help="longest text a request may send")
    p.add_argument(
        "--max-body", type=int, default=64 * 1024, help="largest request body in bytes (413 above)"
    )
    _add_device(p)
    p.set_defaults(func=cmd_explore)

    p = sub.add_parser(
        "serve",
        help="an HTTP server: OpenAI-style completions and chat (continuous batching),"
        " embeddings, translation",
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    _add_allowed_host(p)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", default=None, help="the model name in responses (default: run folder)")
    p.add_argument("--max-batch", type=int, default=16, help="requests decoded together (KV rows)")
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond those (429)")
    p.add_argument(
        "--context",
        type=int,
        default=None,
        help="prompt + completion tokens per request; each KV row holds this many"
        " (default: the model's max_len, at most 4096)",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="default: context - 1")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: context")
    p.add_argument(
        "--max-body",
        type=int,
        default=DEFAULT_MAX_BODY,
        help=f"largest request body in bytes, refused with 413 before it is read"
        f" (default: {DEFAULT_MAX_BODY})",
    )
    p.add_argument(
        "--max-stop-chars",
        type=int,
        default=MAX_STOP_CHARS,
        help=f"longest stop string a request may give (default: {MAX_STOP_CHARS})",
    )
    p.add_argument(
        "--max-n",
        type=int,
        default=MAX_N,
        help=f"most choices (n, best_of) a request may ask for, over its prompts"
        f" (default: {MAX_N})",
    )
    p.add_argument(
        "--prefill-chunk", type=int, default=128, help="prompt tokens per step (chunked prefill)"
    )
    p.add_argument(
        "--no-batching", action="store_true", help="one request at a time (for comparisons)"
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info"])
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/... (default: $AIAYN_API_KEY, or open)",
    )
    _add_device(p)
    _add_precision(p)
    p.set_defaults(func=cmd_serve)
