"""The ``aiayn`` command.  Thin: every subcommand is a call into the library."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from aiayn.checkpoint import load_bundle
from aiayn.config import presets
from aiayn.data.files import data_dir, read_text, split_lines
from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer, Tokenizer
from aiayn.generate.beam import BeamConfig
from aiayn.generate.sampling import SamplingConfig
from aiayn.inspect.summary import summarize
from aiayn.interop.generation_config import GenerationIds, generation_of
from aiayn.interop.hf_folder import load_checkpoint
from aiayn.models import DecoderLM, EncoderDecoder, EncoderLM, build_model
from aiayn.train.loop import FitResult

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo_de_en.toml"


def _overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``key=value`` pairs; values parsed as int, float, bool or None when they look like one."""
    out: dict[str, object] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"override {pair!r} is not of the form field=value")
        key, raw = pair.split("=", 1)
        value: object = raw
        if raw in ("true", "false"):
            value = raw == "true"
        elif raw == "none":
            value = None
        else:
            for cast in (int, float):
                try:
                    value = cast(raw)
                    break
                except ValueError:
                    pass
        out[key] = value
    return out


def _train_overrides(args: argparse.Namespace) -> dict[str, object]:
    """``--set`` overrides, with ``--device`` as ``train.device`` when given."""
    return _overrides(args.set) | ({"train.device": args.device} if args.device else {})


def cmd_presets(args: argparse.Namespace) -> int:
    with torch.device("meta"):
        for name in presets():
            model = build_model(name)
            print(f"{name:<20} {model.config.arch:<16} {model.num_parameters():>14,} parameters")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    with torch.device("meta"):  # shapes only: no memory, no time
        model = build_model(args.preset, **_overrides(args.set))
    print(summarize(model))
    return 0


def cmd_calc(args: argparse.Namespace) -> int:
    """Parameters, FLOPs and memory from the config alone (nothing is built)."""
    from aiayn.inspect.calc import cost_report, format_cost_report, resolve_calc_config

    name, config = resolve_calc_config(args.model, _overrides(args.set))
    report = cost_report(config, args.context, args.batch, args.dtype, name=name)
    print(report.to_json() if args.json else format_cost_report(report))
    return 0


def cmd_explore(args: argparse.Namespace) -> int:
    """Serve the browser explorer on ``--host``:``--port``."""
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
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve a checkpoint over HTTP with continuous batching (aiayn/serve/).  The engine runs
    in this (main) thread, the HTTP server in another (see Engine.run).  Ctrl-C or SIGTERM
    stops both."""
    import signal
    import threading

    import uvicorn

    from aiayn.device import for_inference
    from aiayn.interop.sentence_transformers import read_pooling
    from aiayn.serve.app import create_app

    bundle = load_checkpoint(args.checkpoint)
    model = for_inference(bundle.model, _device(args))
    api_key = args.api_key or os.environ.get("AIAYN_API_KEY") or None
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
        api_key=api_key,
    )
    # On shutdown the engine stops first and every open stream hears an error event and ends,
    # so uvicorn's graceful shutdown (which also runs the app's lifespan to its end) is quick;
    # the timeout bounds it should a client hold its connection open.  A forced exit instead
    # cancels the lifespan and logs a traceback for an ordinary Ctrl-C.
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.log_level,
            timeout_graceful_shutdown=5,
        )
    )  # fmt: skip
    engine = app.state.engine

    def http_server() -> None:
        try:
            server.run()
        finally:  # uvicorn gave up (a port in use exits its thread): stop the engine too
            if engine is not None:
                engine.stop(wait=False)

    def terminate(signum: int, frame: object) -> None:  # SIGTERM (docker stop, systemd): as Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    http = threading.Thread(target=http_server, name="aiayn-http", daemon=True)
    http.start()
    try:
        while not server.started and http.is_alive():
            http.join(0.05)
        if not server.started:
            raise OSError(f"could not serve on {args.host}:{args.port} (see the message above)")
        pool = "" if engine is None else f", KV pool {engine.pool.nbytes() / 2**20:.0f} MiB"
        print(
            f"serving {bundle.directory} on http://{args.host}:{args.port}/{pool}", file=sys.stderr
        )
        if engine is None:  # translation: requests run on the server's worker threads
            while http.is_alive():
                http.join(0.5)
        else:
            engine.run()  # until Ctrl-C
    except KeyboardInterrupt:
        pass
    finally:
        if engine is not None:
            engine.stop()  # first: the open streams end with an error event
        server.should_exit = True
        http.join(10)
        signal.signal(signal.SIGTERM, previous)
        print("aiayn serve: stopped", file=sys.stderr)
    return 0


def _load_encoder(path: str, device: torch.device) -> tuple[EncoderLM, Tokenizer]:
    from aiayn.device import for_inference

    bundle = load_checkpoint(path)
    if not isinstance(bundle.model, EncoderLM):
        raise ValueError(f"{path} holds a {type(bundle.model).__name__}, not an encoder (BERT)")
    return for_inference(bundle.model, device), bundle.tokenizer


def cmd_embed(args: argparse.Namespace) -> int:
    """Sentence embeddings of lines (stdin or --file) to .npy or JSON lines."""
    import json

    import numpy as np

    from aiayn.generate.encoder import sentence_embeddings
    from aiayn.interop.sentence_transformers import read_pooling

    model, tokenizer = _load_encoder(args.checkpoint, _device(args))
    pooling = read_pooling(args.checkpoint)  # a sentence-transformers folder's own recipe
    source = read_text(args.file) if args.file else sys.stdin.read()
    lines = split_lines(source)
    vectors = sentence_embeddings(
        model,
        tokenizer,
        lines,
        batch_size=args.batch_size,
        pooling=pooling,
        truncate=args.truncate,
    ).numpy()
    if args.out and args.out.endswith(".npy"):
        np.save(args.out, vectors)
        print(f"wrote {len(lines)} embeddings of {vectors.shape[1]} to {args.out}", file=sys.stderr)
        return 0
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    try:
        for line, v in zip(lines, vectors, strict=True):
            out.write(
                json.dumps({"text": line, "embedding": [round(float(x), 7) for x in v]}) + "\n"
            )
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def cmd_fill_mask(args: argparse.Namespace) -> int:
    """The likeliest tokens at each [MASK] of a text."""
    import json

    from aiayn.generate.encoder import fill_mask

    model, tokenizer = _load_encoder(args.checkpoint, _device(args))
    if model.head is None:
        raise ValueError(
            f"{args.checkpoint} has no masked-LM head (a BertModel): fill-mask needs the weights"
            " of a BertForMaskedLM or BertForPreTraining"
        )
    guesses = fill_mask(model, tokenizer, args.text, top_k=args.top_k)
    if args.json:
        print(json.dumps([[g.__dict__ for g in mask] for mask in guesses]))
        return 0
    for n, mask in enumerate(guesses, 1):
        print(f"mask {n}:")
        for g in mask:
            print(f"  {g.score:7.4f}  {g.token}")
    return 0


def cmd_inspect_attention(args: argparse.Namespace) -> int:
    """Attention maps of a checkpoint or an untrained preset on a piece of text, or of an image
    model on one of its test images."""
    from aiayn.inspect.attention_maps import attention_maps

    if args.image is not None:
        from aiayn.inspect.image_attention import image_attention

        if not args.checkpoint:
            raise ValueError("--image needs --checkpoint (a trained image model)")
        path, numbers = image_attention(args.checkpoint, args.image, args.out, head=args.head)
        print(f"test image {args.image}: true {numbers['true']}, predicted {numbers['predicted']}")
        print(f"image    {path}")
        return 0
    if args.text is None:
        raise ValueError("--text is required (or --image for an image model)")
    written = attention_maps(
        args.checkpoint or args.preset,
        args.text,
        args.out,
        layer=args.layer,
        head=args.head,
        target_text=args.target,
        overrides=_overrides(args.set),
    )
    for name, path in written.items():
        print(f"{name:<8} {path}")
    return 0


def cmd_inspect_positions(args: argparse.Namespace) -> int:
    """The sinusoidal table, one position's similarity to the others, RoPE's relative scores."""
    from aiayn.inspect import figures

    out = Path(args.out)
    paths = [
        figures.positional_encoding_image(
            args.max_len, args.d_model, out / "positional_encoding.png"
        ),
        figures.positional_similarity(
            args.max_len, args.d_model, args.position, out / "positional_similarity.png"
        ),
        figures.rope_relative_scores(
            args.d_model, max(1, args.max_len // 4), out / "rope_relative.png"
        ),
    ]
    for path in paths:
        print(path)
    return 0


def cmd_inspect_example(args: argparse.Namespace) -> int:
    """A worked example: print its numbers (computed by the library), write its figure."""
    from aiayn.inspect import figures

    name = args.example
    path, numbers = figures.EXAMPLES[name](Path(args.out) / f"example_{name.replace('-', '_')}.png")
    print(figures.format_numbers(numbers))
    print(f"figure: {path}")
    return 0


def _print_result(result: FitResult) -> None:
    if result.already_complete:
        print(
            f"the run is already complete: step {result.step} of {result.max_steps};"
            f" validation loss {result.val_loss:.4f} nats/token; checkpoint {result.checkpoint}"
        )
        return
    padding = result.padding_fraction
    print(
        f"step {result.step} of {result.max_steps}: validation loss {result.val_loss:.4f}"
        f" nats/token (final model); {result.tokens_per_s:,.0f} target tokens/s"
        + (f"; padding {padding:.1%} of batch slots" if padding is not None else "")
        + f"; peak memory {result.peak_rss_mib:,.0f} MiB; checkpoint {result.checkpoint}"
    )
    if result.skipped_steps:
        print(f"updates skipped (loss not finite) at steps {result.skipped_steps}")


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: train the paper's model on Multi30k for a fixed number of steps, then
    translate test sentences with beam search and score them."""
    from aiayn.checkpoint import RunDir, read_run
    from aiayn.data.parallel import multi30k
    from aiayn.device import matmul_gflops
    from aiayn.evaluate.translation import score
    from aiayn.generate.translate import translate
    from aiayn.train.config import load_run_config
    from aiayn.train.translate import train_translation

    t_start = time.perf_counter()
    root = data_dir(args.data)
    overrides = _train_overrides(args)
    run = load_run_config(args.config, overrides)
    rd = RunDir(args.out)
    rd.recover()
    latest = rd.latest()
    wanted = run.to_dict()
    done = read_run(latest) if latest is not None else {}
    # A demo stopped part-way (Ctrl-C, a kill) continues; any other run there starts again.
    resume = all(done.get(key) == wanted[key] for key in ("train", "data"))
    print(
        f"aiayn demo: {args.config}, {run.train.max_steps} steps of about"
        f" {run.train.max_tokens} tokens, on {root / 'multi30k'}"
        f" (this host: torch.mm at {matmul_gflops():.0f} GFLOP/s in fp32,"
        f" {torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''})"
    )
    if resume:
        print(f"continuing the demo run in {rd.root}")
    result = train_translation(run, args.out, root, resume=resume, overwrite=not resume)
    _print_result(result)
    model, tokenizer, _ = _load_translator(str(result.checkpoint), _device(args))
    print(summarize(model))
    test = multi30k(
        root / "multi30k", "test_2016_flickr", run.data.source_lang, run.data.target_lang
    )[: args.sentences]
    t0 = time.perf_counter()
    hyps = translate(model, tokenizer, [p.source for p in test], beam=BeamConfig())
    decode_s = time.perf_counter() - t0
    for pair, hyp in list(zip(test, hyps, strict=True))[:5]:
        print(f"\n  source     {pair.source}\n  reference  {pair.target}\n  aiayn      {hyp}")
    print(
        f"\ntest_2016_flickr, first {len(test)} sentences, beam 4 ({decode_s:.0f} s):"
        f" {score(hyps, [p.target for p in test])}"
    )
    print(f"demo: {(time.perf_counter() - t_start) / 60:.1f} min in all")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import os

    import torch.distributed as dist

    from aiayn.train.config import load_run_config
    from aiayn.train.lm import train_lm
    from aiayn.train.translate import train_translation

    overrides = _train_overrides(args)
    run = load_run_config(args.config, overrides)
    from aiayn.train.masked_lm import train_masked_lm
    from aiayn.train.vision import train_vision

    trainers = {
        "decoder": train_lm,
        "encoder-decoder": train_translation,
        "encoder": train_masked_lm,
    }
    kind = "image" if run.model.image_size is not None else run.model.arch
    trainers["image"] = train_vision
    if kind not in trainers:
        raise ValueError(f"aiayn train has no task for arch={run.model.arch!r} yet")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():  # torchrun
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        result = trainers[kind](
            run, args.out, data_dir(args.data), resume=args.resume, overwrite=args.overwrite
        )
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    _print_result(result)
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    """Hugging Face checkpoint folders in (--from-hf) and out (--to-hf FAMILY)."""
    from aiayn.interop.hf_folder import convert_from_hf, save_hf_folder

    _check_out(args.out, args.overwrite)
    if args.from_hf:
        path = convert_from_hf(args.from_hf, args.out)
        print(f"wrote the aiayn checkpoint {path}")
        return 0
    if not args.checkpoint:
        raise ValueError("--to-hf needs --checkpoint (the aiayn checkpoint to export)")
    bundle = load_bundle(args.checkpoint)
    if not isinstance(bundle.model, DecoderLM | EncoderLM | EncoderDecoder):
        raise ValueError(f"{args.checkpoint}: a {type(bundle.model).__name__} has no HF layout")
    tok = bundle.tokenizer if isinstance(bundle.tokenizer, BPETokenizer) else None
    path = save_hf_folder(bundle.model, args.out, args.to_hf, tokenizer=tok)
    print(f"wrote the Hugging Face folder {path}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from aiayn.experiment import collect, load_sweep, run_sweep, write_report

    sweep = load_sweep(args.sweep)
    out = Path(args.out) if args.out else Path("runs") / Path(args.sweep).stem
    if not args.report_only:
        batches = f" of {sweep.max_tokens} tokens" if sweep.max_tokens else ""
        print(f"{sweep.title}: {len(sweep.variants)} variants, {sweep.steps} steps{batches}"
              f" each, in {out}")  # fmt: skip
        try:
            run_sweep(sweep, out, data_dir(args.data), only=args.only, progress=not args.quiet)
        except BaseException:
            write_report(sweep, collect(sweep, out), out)  # what finished, before stopping
            raise
    results = collect(sweep, out)
    if args.report_only and not results:
        raise ValueError(
            f"nothing to report in {out}: no variant of {args.sweep} has finished there"
            " (run the sweep without --report-only, or give its --out)"
        )
    for path in write_report(sweep, results, out):
        print(f"wrote {path}")
    print((out / "table.md").read_text())
    return 0


def _beam(args: argparse.Namespace) -> BeamConfig | None:
    if args.greedy:
        return None
    return BeamConfig(beam_size=args.beam, length_penalty=args.alpha, max_extra=args.max_extra)


def _device(args: argparse.Namespace) -> torch.device:
    from aiayn.device import resolve_device

    return resolve_device(getattr(args, "device", "auto") or "auto")


def _load_translator(
    path: str, device: torch.device | None = None
) -> tuple[EncoderDecoder, BPETokenizer | MarianTokenizer, GenerationIds]:
    """A translation model, its tokenizer and its folder's generation ids (none for a model
    aiayn trained)."""
    from aiayn.device import for_inference

    bundle = load_checkpoint(path)
    model, tokenizer = bundle.model, bundle.tokenizer
    if device is not None:
        for_inference(model, device)
    if not isinstance(model, EncoderDecoder) or not isinstance(
        tokenizer, BPETokenizer | MarianTokenizer
    ):
        raise ValueError(f"{path} is not a translation checkpoint (an encoder-decoder with BPE)")
    return model.eval(), tokenizer, generation_of(bundle.run)


def cmd_translate(args: argparse.Namespace) -> int:
    from aiayn.generate.translate import translate

    model, tokenizer, ids = _load_translator(args.checkpoint, _device(args))
    text_in = read_text(args.input) if args.input else sys.stdin.read()
    lines = split_lines(text_in)
    out = translate(
        model,
        tokenizer,
        lines,
        beam=_beam(args),
        batch_size=args.batch_size,
        truncate=args.truncate,
        generation=ids,
    )
    text = "".join(f"{line}\n" for line in out)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _check_out(path: str, overwrite: bool) -> None:
    """``--out`` of a command that writes one whole folder, replacing what is there: a new or
    empty folder, or with ``--overwrite`` an existing one -- but never a link (a run's
    ``checkpoint`` link) or a training run, whose other files would go with it."""
    out = Path(path)
    if out.is_symlink():
        raise ValueError(f"--out {out} is a link; give the folder to write, not a link to one")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    markers = ("log.csv", "snapshots", "checkpoint", "train_state.pt")  # a run, a resumable state
    run = [n for n in markers if (out / n).exists() or (out / n).is_symlink()]
    if run:
        raise ValueError(
            f"--out {out} holds a training run or its checkpoint ({', '.join(run)}): writing"
            " there would replace all of it; give a new folder"
        )
    if not overwrite:
        raise ValueError(
            f"--out {out} exists and is not empty: everything in it would be replaced; give a"
            " new folder, or --overwrite to replace it"
        )


def cmd_average(args: argparse.Namespace) -> int:
    from aiayn.checkpoint import save_with_companions
    from aiayn.checkpoint.bundle import TOKENIZER_FILE
    from aiayn.train.average import average_checkpoints

    _check_out(args.out, args.overwrite)
    # One vocabulary: the average keeps the last checkpoint's tokenizer, and a token id must
    # mean the same in every model averaged.
    first = Path(args.checkpoints[0]) / TOKENIZER_FILE
    for other in args.checkpoints[1:]:
        path = Path(other) / TOKENIZER_FILE
        if first.is_file() != path.is_file() or (
            first.is_file() and first.read_bytes() != path.read_bytes()
        ):
            raise ValueError(
                f"cannot average {other} with {args.checkpoints[0]}: their tokenizers"
                f" ({TOKENIZER_FILE}) differ, so their token ids do not mean the same"
            )
    model = average_checkpoints(args.checkpoints)
    # The last checkpoint's tokenizer and run config go along: the average translates and
    # evaluates directly.
    save_with_companions(model, args.out, args.checkpoints[-1])
    print(f"averaged {len(args.checkpoints)} checkpoints into {args.out}")
    return 0


def _load_lm(
    path: str, device: torch.device | None = None
) -> tuple[DecoderLM, Tokenizer, GenerationIds]:
    """A decoder-only model, its tokenizer and its BOS / PAD / EOS ids (generation_config.json
    of a Hugging Face folder; none for a model aiayn trained)."""
    from aiayn.device import for_inference

    bundle = load_checkpoint(path)
    model, tokenizer = bundle.model, bundle.tokenizer
    if device is not None:
        for_inference(model, device)
    if not isinstance(model, DecoderLM):
        raise ValueError(
            f"{path} holds a {type(model).__name__}, not a decoder-only language model"
        )
    return model.eval(), tokenizer, generation_of(bundle.run)


def _sampling(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    """Continue a prompt, streaming whole characters; stop at the checkpoint's EOS ids
    (unless --ignore-eos), which are not printed."""
    from aiayn.generate import generate
    from aiayn.generate.text import TextStream

    model, tokenizer, ids = _load_lm(args.checkpoint, _device(args))
    eos = () if args.ignore_eos else ids.eos
    prompt_ids = tokenizer.encode(args.prompt)
    if not prompt_ids:
        raise ValueError("the prompt is empty: give at least one character")
    sys.stdout.write(args.prompt)
    text = TextStream(tokenizer.decode, prompt_ids)

    def show(token: torch.Tensor) -> None:
        if int(token[0]) not in eos:
            sys.stdout.write(text.add(int(token[0])))
            sys.stdout.flush()

    generate(
        model,
        [prompt_ids],
        max_new_tokens=args.max_new_tokens,
        sampling=_sampling(args),
        seed=args.seed,
        eos_id=eos,
        stop=args.stop or (),
        decode=tokenizer.decode,
        truncate=args.truncate,
        on_token=show,
    )
    sys.stdout.write(text.rest() + "\n")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """An interactive chat in the terminal: one line per user message, the reply streamed.
    ``/reset`` starts again, ``/exit`` (or end of input) leaves."""
    from aiayn.generate.chat import Chat

    model, tokenizer, ids = _load_lm(args.checkpoint, _device(args))
    if not isinstance(tokenizer, BPETokenizer):
        raise ValueError(
            f"{args.checkpoint}: a chat needs a Hugging Face tokenizer with a template"
        )
    chat = Chat(
        model,
        tokenizer,
        ids,
        sampling=_sampling(args),
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        system=args.system,
    )
    prompt = "you> " if sys.stdin.isatty() else ""
    while True:
        sys.stdout.write(prompt)
        sys.stdout.flush()
        line = sys.stdin.readline()
        if not line or line.strip() == "/exit":
            return 0
        if line.strip() == "/reset":
            chat.reset()
            continue
        if not line.strip():
            continue
        sys.stdout.write("assistant> " if prompt else "")
        try:
            for piece in chat.reply(line.rstrip("\n")):
                sys.stdout.write(piece)
                sys.stdout.flush()
        except ValueError as err:  # the conversation outgrew the model: say so, go on
            sys.stdout.write(f"[{err}]")
        sys.stdout.write("\n")


def cmd_evaluate(args: argparse.Namespace) -> int:
    import math

    from aiayn.data.lm_data import TokenStream
    from aiayn.device import for_inference
    from aiayn.evaluate.perplexity import evaluate_lm

    bundle = load_checkpoint(args.checkpoint)
    model, tokenizer = bundle.model, bundle.tokenizer
    for_inference(model, _device(args))
    data = bundle.run.get("data", {})
    if isinstance(model, EncoderDecoder):
        return _evaluate_translation(args, model, tokenizer, data)
    if model.config.image_size is not None:
        return _evaluate_images(model, bundle.run)
    text = args.text or data.get("text")
    if not text:
        raise ValueError("no text to evaluate on: pass --text FILE")
    path = Path(text) if Path(text).is_file() else data_dir(args.data) / text
    stream = TokenStream.from_file(path, tokenizer, train_fraction=data.get("train_fraction", 0.9))
    block = args.block or model.config.max_len
    loss = evaluate_lm(model, stream, batches=args.batches, batch_size=args.batch_size, block=block)  # type: ignore[arg-type]
    print(f"validation loss    {loss:.4f} nats/token")
    print(f"perplexity         {math.exp(loss):.3f}")
    if tokenizer.kind == "char":
        print(f"bits per character {loss / math.log(2):.4f}")
    return 0


def _evaluate_images(model: object, run: dict[str, object]) -> int:
    from aiayn.data.images import load_split
    from aiayn.evaluate.images import baselines, score_classifier
    from aiayn.models.vision import VisionTransformer
    from aiayn.train.config import DataConfig

    assert isinstance(model, VisionTransformer)
    d = DataConfig(**run.get("data", {}))  # type: ignore[arg-type]
    split = load_split(d.images, test_fraction=d.test_fraction, seed=d.seed)
    scores = score_classifier(model, split)
    print(f"{d.images}: {scores['test_images']} held-out test images (never trained on)")
    print(f"  Vision Transformer      accuracy {scores['accuracy']:.4f}")
    for name, accuracy in baselines(split).items():
        print(f"  {name:<23} accuracy {accuracy:.4f}  (same training images)")
    print("confusion matrix (rows: true class, columns: predicted):")
    print("      " + " ".join(f"{label:>4}" for label in split.labels))
    for label, row in zip(split.labels, scores["confusion"], strict=True):
        print(f"  {label:>3} " + " ".join(f"{n:>4}" for n in row))
    return 0


def _evaluate_translation(
    args: argparse.Namespace, model: EncoderDecoder, tokenizer: object, data: dict[str, object]
) -> int:
    from aiayn.data.parallel import multi30k
    from aiayn.evaluate.translation import evaluate_translation

    if not isinstance(tokenizer, BPETokenizer | MarianTokenizer):
        raise ValueError("a translation checkpoint needs a BPE or Marian tokenizer")
    src_lang, tgt_lang = str(data.get("source_lang", "de")), str(data.get("target_lang", "en"))
    pairs = multi30k(data_dir(args.data) / "multi30k", args.split, src_lang, tgt_lang)
    if args.limit is not None:
        if args.limit < 1:
            raise ValueError(f"--limit {args.limit}: score at least 1 sentence")
        pairs = pairs[: args.limit]
    sources, refs = [p.source for p in pairs], [p.target for p in pairs]
    t0 = time.perf_counter()
    scores, hyps = evaluate_translation(model.eval(), tokenizer, sources, refs, beam=_beam(args))
    seconds = time.perf_counter() - t0
    if args.output:
        Path(args.output).write_text("".join(f"{h}\n" for h in hyps), encoding="utf-8")
    mode = "greedy" if args.greedy else f"beam {args.beam}, alpha {args.alpha}"
    print(f"{args.split} {src_lang}->{tgt_lang}, {len(pairs)} sentences, {mode}: {scores}")
    print(f"decoding: {seconds:.1f} s, {len(pairs) / seconds:.1f} sentences/s")
    return 0


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", default=None, help="auto (a GPU when there is one), cpu, cuda or cuda:N"
    )


def _add_decoding(p: argparse.ArgumentParser) -> None:
    p.add_argument("--beam", type=int, default=4, help="beam size (§6.1: 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty (§6.1: 0.6)")
    p.add_argument("--max-extra", type=int, default=50, help="output length <= input + this")
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of beam search")


def _add_set(p: argparse.ArgumentParser, metavar: str, help_: str) -> None:
    """``--set A=1 B=2``, repeatable: every occurrence counts (argparse's default keeps only
    the last)."""
    p.add_argument("--set", nargs="*", action="extend", default=[], metavar=metavar, help=help_)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiayn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("presets", help="list the model presets and their sizes")
    p.set_defaults(func=cmd_presets)

    p = sub.add_parser("info", help="summarise a preset (with overrides)")
    p.add_argument("preset", help=f"one of: {', '.join(presets())}")
    _add_set(p, "FIELD=VALUE", "config overrides")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("calc", help="parameters, FLOPs and memory of a config, without building it")
    p.add_argument(
        "model",
        help=f"a preset ({', '.join(presets())}), a config JSON file or a saved model folder",
    )
    _add_set(p, "FIELD=VALUE", "config overrides")
    p.add_argument(
        "--context", type=int, default=None, help="tokens per sequence (default: max_len)"
    )
    p.add_argument("--batch", type=int, default=1)
    p.add_argument(
        "--dtype", default="bf16", help="float32/fp32, bfloat16/bf16, float16/fp16, int8, fp8"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_calc)

    p = sub.add_parser(
        "demo", help="train on Multi30k for a fixed number of steps, translate, print BLEU"
    )
    p.add_argument(
        "--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)"
    )
    p.add_argument("--config", default=str(DEMO_CONFIG))
    p.add_argument("--out", default="runs/demo")
    _add_set(p, "TABLE.FIELD=VALUE", "config overrides")
    p.add_argument("--sentences", type=int, default=200, help="test sentences to score")
    _add_device(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a model from a TOML config (see configs/)")
    p.add_argument("config")
    p.add_argument("--out", default="runs/default", help="run folder: checkpoint/ and log.csv")
    p.add_argument(
        "--data", default=None, help="data folder (default: $AIAYN_DATA or ../shared/data)"
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint")
    p.add_argument(
        "--overwrite", action="store_true", help="replace the run already in OUT (if any)"
    )
    _add_set(p, "TABLE.FIELD=VALUE", "e.g. train.max_steps=100")
    _add_device(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("generate", help="continue a prompt with a language model, streaming")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt", default="\n")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", help="stop once this text appears (repeatable)")
    p.add_argument("--truncate", action="store_true", help="keep the end of an over-long prompt")
    p.add_argument(
        "--ignore-eos", action="store_true", help="go on past the checkpoint's end-of-text ids"
    )
    _add_device(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="talk to a chat model in the terminal (its chat template)")
    p.add_argument("--checkpoint", required=True, help="a folder with a chat_template")
    p.add_argument("--system", default=None, help="a system message opening the conversation")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    _add_device(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("evaluate", help="validation loss, perplexity and bits per character")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", default=None)
    p.add_argument("--text", default=None, help="text file (default: the one the model trained on)")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--block", type=int, default=None)
    p.add_argument("--split", default="test_2016_flickr", help="Multi30k split (translation)")
    p.add_argument("--limit", type=int, default=None, help="first N sentences only")
    p.add_argument("--output", default=None, help="write the translations to this file")
    _add_decoding(p)
    _add_device(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("translate", help="translate lines (stdin -> stdout, or files)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--input", default=None, help="file to translate (default: stdin)")
    p.add_argument("--output", default=None, help="where to write (default: stdout)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--truncate", action="store_true", help="cut over-long lines instead of failing")
    _add_decoding(p)
    _add_device(p)
    p.set_defaults(func=cmd_translate)

    p = sub.add_parser("average", help="average model checkpoints (§6.1)")
    p.add_argument("checkpoints", nargs="+", help="model folders with one config")
    p.add_argument("--out", required=True, help="a new folder (an existing one: --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.set_defaults(func=cmd_average)

    p = sub.add_parser("inspect", help="pictures: attention maps, positions, worked examples")
    inspect = p.add_subparsers(dest="what", required=True)
    q = inspect.add_parser(
        "attention", help="attention maps of a checkpoint or an untrained preset on a text"
    )
    model = q.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", help="a trained checkpoint folder")
    model.add_argument("--preset", help=f"an untrained preset: {', '.join(presets())}")
    q.add_argument("--text", default=None, help="the (source) text")
    q.add_argument(
        "--image", type=int, default=None, help="an image model: the index of a test image"
    )
    q.add_argument("--target", default=None, help="encoder-decoder target text (default: --text)")
    q.add_argument("--layer", type=int, default=None, help="one layer, from 0 (default: all)")
    q.add_argument("--head", type=int, default=None, help="one head of --layer, from 0")
    q.add_argument("--out", default="figures", help="folder for the PNGs (default: figures/)")
    _add_set(q, "FIELD=VALUE", "preset overrides")
    q.set_defaults(func=cmd_inspect_attention)
    q = inspect.add_parser("positions", help="sinusoidal encodings and RoPE's relative scores")
    q.add_argument("--max-len", type=int, default=128, help="positions to draw")
    q.add_argument("--d-model", type=int, default=64, help="encoding width (and RoPE head size)")
    q.add_argument("--position", type=int, default=20, help="position to compare with the rest")
    q.add_argument("--out", default="figures", help="folder for the PNGs (default: figures/)")
    q.set_defaults(func=cmd_inspect_positions)
    q = inspect.add_parser("example", help="a worked example: print the numbers, draw the figure")
    q.add_argument("example", choices=["trophy", "not-good", "scale", "paths", "nadaraya-watson"])
    q.add_argument("--out", default="figures", help="folder for the PNG (default: figures/)")
    q.set_defaults(func=cmd_inspect_example)

    p = sub.add_parser("convert", help="Hugging Face checkpoint folders in and out")
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from-hf", metavar="DIR", help="an HF folder (config.json, safetensors)")
    way.add_argument(
        "--to-hf", metavar="FAMILY", choices=["gpt2", "llama", "mistral", "qwen2", "mixtral", "bert", "marian", "bart"],
        help="write --checkpoint as this HF family",
    )  # fmt: skip
    p.add_argument("--checkpoint", help="the aiayn checkpoint to export (with --to-hf)")
    p.add_argument(
        "--out", required=True, help="the folder to write (an existing one: --overwrite)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser(
        "experiment",
        help="run a sweep of variants (e.g. Table 3), resumable; write its table and plot",
    )
    p.add_argument("sweep", help="a sweep TOML file (experiments/*.toml)")
    p.add_argument("--out", default=None, help="its folder (default: runs/SWEEP_NAME)")
    p.add_argument("--only", nargs="*", default=[], metavar="NAME", help="run only these variants")
    p.add_argument("--data", default=None, help="data folder (default: $AIAYN_DATA)")
    p.add_argument("--report-only", action="store_true", help="write the report of what is done")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_experiment)

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
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-chars", type=int, default=400, help="longest text a request may send")
    p.add_argument(
        "--max-body", type=int, default=64 * 1024, help="largest request body in bytes (413 above)"
    )
    _add_device(p)
    p.set_defaults(func=cmd_explore)

    p = sub.add_parser(
        "embed", help="sentence embeddings from an encoder (BERT), pooled as the folder says"
    )
    p.add_argument("--checkpoint", required=True, help="an aiayn or Hugging Face BERT folder")
    p.add_argument("--file", default=None, help="one text per line (default: stdin)")
    p.add_argument("--out", default=None, help="PATH.npy, or JSON lines (default: stdout)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--truncate", action="store_true", help="keep the start of over-long texts")
    _add_device(p)
    p.set_defaults(func=cmd_embed)

    p = sub.add_parser("fill-mask", help="the likeliest tokens at each [MASK] of a text (BERT)")
    p.add_argument("text", help='e.g. "Paris is the [MASK] of France."')
    p.add_argument("--checkpoint", required=True, help="an aiayn or Hugging Face BERT folder")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--json", action="store_true")
    _add_device(p)
    p.set_defaults(func=cmd_fill_mask)

    p = sub.add_parser(
        "serve",
        help="an HTTP server: OpenAI-style completions and chat (continuous batching),"
        " embeddings, translation",
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--name", default=None, help="the model name in responses (default: run folder)")
    p.add_argument("--max-batch", type=int, default=16, help="requests decoded together (KV rows)")
    p.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond those (429)")
    p.add_argument(
        "--context", type=int, default=None,
        help="prompt + completion tokens per request; each KV row holds this many"
        " (default: the model's max_len, at most 4096)",
    )  # fmt: skip
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="default: context - 1")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: context")
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
    p.set_defaults(func=cmd_serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from aiayn.train.loop import NonFiniteLoss
    from aiayn.train.policy import TrainingInterrupted

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except TrainingInterrupted as err:
        print(f"aiayn: {err}", file=sys.stderr)
        return 130 if err.signal_name == "SIGINT" else 143
    except NonFiniteLoss as err:
        print(f"aiayn: error: {err}", file=sys.stderr)
        return 3
    except (ValueError, OSError) as err:
        print(f"aiayn: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # an optional extra that is not installed
        from aiayn.extras import advice

        line = advice(err.name or "", getattr(args, "command", None))
        if line is None:
            raise
        print(f"aiayn: error: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
