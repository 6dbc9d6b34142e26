"""The engine: continuous batching gives every request what `generate` gives it alone;
stop strings, cancellation, failures and limits behave."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from aiayn.generate import SamplingConfig, generate
from aiayn.models import DecoderLM
from aiayn.models.precision import Precision, apply_precision
from aiayn.nn.cpu_decoding import for_decoding
from aiayn.nn.quantized import Int8Linear
from aiayn.serve.engine import Engine, Event, QueueFull, Request
from tests.serve.support import sharpen, tiny_lm

GREEDY = SamplingConfig(temperature=0)


def decode(ids: list[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids)


def lm(kind: str = "learned") -> DecoderLM:
    """A 2-layer model of ``kind`` (tests/serve/kinds.py) over the 26 letters."""
    return tiny_lm(kind, vocab_size=26)


@pytest.fixture
def engines() -> Iterator[Callable[..., Engine]]:
    """``engines(model, **kw)`` builds an engine (not started); every one is stopped when the
    test ends, whether it passed or not, so that no engine thread outlives its test."""
    made: list[Engine] = []

    def make(model: DecoderLM, **kw: object) -> Engine:
        engine = Engine(model, decode, **kw)  # type: ignore[arg-type]
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.stop(wait=False)
    for engine in made:
        if engine.thread is not None:
            engine.thread.join(30)
            assert not engine.thread.is_alive(), "an engine thread did not stop"


def widest_batch(engine: Engine) -> list[int]:
    """Record, in the returned list, the number of rows of each of ``engine``'s decoding
    steps (the turns of the loop with none running decode nothing)."""
    rows: list[int] = []
    step = engine._decode_step

    def counted() -> None:
        if engine.running:
            rows.append(len(engine.running))
        step()

    engine._decode_step = counted  # type: ignore[method-assign]
    return rows


class Collector:
    """Gathers each request's events; ``wait`` until every request has finished."""

    def __init__(self) -> None:
        self.events: dict[int, list[Event]] = {}
        self.done = threading.Condition()

    def sink(self, key: int) -> Callable[[Event], None]:
        self.events[key] = []

        def emit(event: Event) -> None:
            with self.done:
                self.events[key].append(event)
                self.done.notify_all()

        return emit

    def finished(self, key: int) -> bool:
        return any(e.kind != "token" for e in self.events[key])

    def wait(self, timeout: float = 60.0) -> None:
        with self.done:
            assert self.done.wait_for(lambda: all(map(self.finished, self.events)), timeout)

    def text(self, key: int) -> str:
        return "".join(e.text for e in self.events[key] if e.kind == "token")


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 30, (n,), generator=g).tolist()
    return [torch.randint(0, 26, (k,), generator=g).tolist() for k in lengths]


@pytest.mark.parametrize(
    ("kind", "max_batch", "batching"),
    [
        ("learned", 3, True),
        ("learned", 8, True),
        ("rope", 3, True),
        ("alibi", 3, True),
        ("gqa-llama", 3, True),
        ("rope", 3, False),
    ],
    ids=["learned-3", "learned-8", "rope-3", "alibi-3", "gqa-llama-3", "rope-no-batching"],
)
def test_eight_concurrent_greedy_requests_equal_offline_generate(
    engines: Callable[..., Engine], kind: str, max_batch: int, batching: bool
) -> None:
    """Rows join and leave the batch at different steps (lengths 1-29, 4-19 new tokens,
    prompts prefilled in chunks of 7), and each request still gets the offline tokens, for
    every positional scheme, grouped-query attention, and one request at a time
    (``batching=False``, ``aiayn serve --no-batching``).  The eight requests are queued before
    the loop starts, so the batch is as wide as it may be, whatever the host's speed."""
    equals_offline(engines, sharpen(lm(kind)), max_batch, batching, kind)


def test_requests_with_a_bf16_kv_cache_equal_offline_generate_with_it(
    engines: Callable[..., Engine],
) -> None:
    """`aiayn serve --kv-cache-dtype bfloat16`: the batched, ragged engine gives each request
    the tokens offline generation gives with the same cache."""
    m = apply_precision(sharpen(lm()), torch.device("cpu"), Precision(kv_cache="bfloat16"))
    equals_offline(engines, m, 8, True, "bf16 KV cache")


@pytest.mark.parametrize("kv_cache", [None, "bfloat16"])
def test_int8_requests_differ_from_offline_generate_only_at_near_ties(
    engines: Callable[..., Engine], kv_cache: str | None, int8_bits: int
) -> None:
    """`aiayn serve --quantize int8` is not batch-invariant: fbgemm's dynamic int8 product
    quantizes a call's activations with one step for all its rows, so a row's product depends
    on the rows beside it, and a request may take another token than offline int8 generation
    where two tokens nearly tie.  So each served token is held to being the int8 model's best
    for its prefix (offline, one sequence, the same kernel) within a bound derived from the
    kernel's activation steps (:func:`near_tie_bound`): 6 standard deviations of what rounding
    the activations (and a bf16 cache's keys and values) moves the two logits' difference.
    A wrong row, cache position or scale misses by whole logits."""
    precision = Precision(quantize="int8", kv_cache=kv_cache)
    m = apply_precision(sharpen(lm()), torch.device("cpu"), precision)
    engine = engines(m, max_batch=8, prefill_chunk=7)
    got = Collector()
    ps = prompts(8)
    requests = [Request(p, 4 + 2 * i, GREEDY, emit=got.sink(i)) for i, p in enumerate(ps)]
    for r in requests:
        engine.submit(r)
    with activation_steps(m) as served_steps:
        engine.start()
        got.wait()
        engine.stop()
    for i, (p, r) in enumerate(zip(ps, requests, strict=True)):
        assert r.finish_reason == "length" and len(r.tokens) == 4 + 2 * i
        ids = torch.tensor([p + r.tokens])
        with torch.no_grad(), for_decoding(m, 1), activation_steps(m) as offline_steps:
            logits = m(ids)[0, len(p) - 1 : -1]  # (new, V): the same int8 kernel, one sequence
        chosen = torch.tensor(r.tokens)
        best = logits.argmax(-1)
        gap = logits.max(-1).values - logits[torch.arange(len(chosen)), chosen]  # (new,)
        steps = {k: (served_steps[k], offline_steps[k]) for k in offline_steps}
        bound = near_tie_bound(m, ids, len(p) - 1, best, chosen, steps, kv_cache is not None)
        assert bool((gap <= bound).all()), f"request {i}: gaps {gap} over {bound}"


@contextmanager
def activation_steps(m: DecoderLM) -> Iterator[dict[str, float]]:
    """Within the block, the widest activation step (the call's range over 2^bits - 1, as
    fbgemm quantizes it) of each int8 layer of ``m`` over its kernel calls, by layer name."""
    from aiayn.nn import cpu_decoding, int8_kernel

    names = {id(mod): name for name, mod in m.named_modules()}
    widest: dict[str, float] = {}
    forward = cpu_decoding.DecodingInt8Linear.forward

    def spy(self: cpu_decoding.DecodingInt8Linear, x: torch.Tensor) -> torch.Tensor:
        span = float(x.max().clamp(min=0) - x.min().clamp(max=0))
        step = span / (2**int8_kernel.INT8_ACTIVATION_BITS - 1)
        widest[names[id(self)]] = max(step, widest.get(names[id(self)], 0.0))
        return forward(self, x)

    cpu_decoding.DecodingInt8Linear.forward = spy  # type: ignore[method-assign]
    try:
        yield widest
    finally:
        cpu_decoding.DecodingInt8Linear.forward = forward  # type: ignore[method-assign]


def near_tie_bound(
    m: DecoderLM,
    ids: torch.Tensor,
    first: int,
    best: torch.Tensor,
    chosen: torch.Tensor,
    steps: dict[str, tuple[float, float]],
    bf16_cache: bool,
) -> torch.Tensor:
    """(new,) how far rounding can move ``d = logit[best] - logit[chosen]`` at each new position
    (rows ``first``...) between two int8 computations, served and offline.

    Each computation rounds every activation entering an int8 layer to its call's step ``s``
    (served: the widest of any call; offline: its own): an error uniform over one step, of
    variance s^2 / 12.  To first order ``d`` moves by the sum of those errors times
    ``d``'s gradient with respect to each activation (taken on the dequantized model), so with
    independent errors its variance is the sum of gradient^2 s^2 / 12 over both computations.
    A bf16 KV cache also rounds each key and value to 8 significant bits (relative step
    2^-8); the bound counts that on the whole q/k/v product, which over-counts the queries.
    6 standard deviations: a Gaussian sum passes that once in 10^9."""
    layers = {n: mod for n, mod in m.named_modules() if isinstance(mod, Int8Linear)}
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = [
        mod.register_forward_hook(lambda _, a, out, n=n: seen.__setitem__(n, (a[0], out)))
        for n, mod in layers.items()
    ]
    try:
        with torch.enable_grad():
            logits = m(ids)[0]  # (T, V): dequantized weights, exact activations
    finally:
        for h in hooks:
            h.remove()
    sigmas = []
    for k, (a, b) in enumerate(zip(best.tolist(), chosen.tolist(), strict=True)):
        d = logits[first + k, a] - logits[first + k, b]
        inputs = [seen[n][0] for n in layers]
        outputs = [seen[n][1] for n in layers]
        grads = torch.autograd.grad(d, inputs + outputs, retain_graph=True, allow_unused=True)
        var = 0.0
        for n, g_in, g_out, y in zip(
            layers, grads[: len(layers)], grads[len(layers) :], outputs, strict=True
        ):
            served, offline = steps[n]
            if g_in is not None:
                var += float(g_in.pow(2).sum()) * (served**2 + offline**2) / 12
            if bf16_cache and n.endswith("qkv") and g_out is not None:
                var += float((g_out * y.detach() * 2**-8).pow(2).sum()) / 12
        sigmas.append(var**0.5)
    return 6 * torch.tensor(sigmas)


def equals_offline(
    engines: Callable[..., Engine],
    m: DecoderLM,
    max_batch: int,
    batching: bool,
    kind: str,
) -> None:
    """Eight requests of different lengths through an engine of ``max_batch`` rows, each
    against ``generate`` alone."""
    engine = engines(m, max_batch=max_batch, prefill_chunk=7, batching=batching)
    rows = widest_batch(engine)
    got = Collector()
    ps = prompts(8)
    requests = [Request(p, 4 + 2 * i, GREEDY, emit=got.sink(i)) for i, p in enumerate(ps)]
    for r in requests:
        engine.submit(r)
    engine.start()
    got.wait()
    engine.stop()
    for i, (p, r) in enumerate(zip(ps, requests, strict=True)):
        want = generate(m, [p], max_new_tokens=4 + 2 * i, sampling=GREEDY)[0]
        assert r.tokens == want, f"request {i} ({kind}): {r.tokens} != offline {want}"
        assert got.text(i) == decode(want) and r.finish_reason == "length"
    # Each step decodes (n, 1) ids: several rows at once when batching, one row without.
    assert (1 < max(rows) <= max_batch) if batching else set(rows) == {1}, rows
    want_free = max_batch if batching else 1
    assert engine.stats["finished_length"] == 8 and len(engine.free_rows) == want_free


def test_sampling_with_a_seed_equals_offline_generate_whatever_the_batch(
    engines: Callable[..., Engine],
) -> None:
    m = lm()
    engine = engines(m, max_batch=5)
    got = Collector()
    ps = prompts(5, seed=2)
    # Greedy rows share one argmax, except one with a repetition penalty: it needs its own.
    settings = [
        SamplingConfig(temperature=0.9, top_k=5),
        SamplingConfig(top_p=0.8),
        SamplingConfig(temperature=1.2, repetition_penalty=1.3),
        GREEDY,
        SamplingConfig(temperature=0, repetition_penalty=3.0),
    ]
    requests = [
        Request(p, 10, s, seed=7 + i, emit=got.sink(i))
        for i, (p, s) in enumerate(zip(ps, settings, strict=True))
    ]
    for r in requests:
        engine.submit(r)
    engine.start()  # all five queued first: they decode together
    got.wait()
    engine.stop()
    for i, r in enumerate(requests):
        want = generate(m, [ps[i]], max_new_tokens=10, sampling=settings[i], seed=7 + i)[0]
        assert r.tokens == want, i


def test_stop_strings_end_the_text_before_them_and_are_never_streamed(
    engines: Callable[..., Engine],
) -> None:
    m = lm()
    p = prompts(1, seed=3)[0]
    full = decode(generate(m, [p], max_new_tokens=30, sampling=GREEDY)[0])
    stop = full[10:13]  # a string the model will produce
    engine = engines(m).start()
    got = Collector()
    r = Request(p, 30, GREEDY, stop=[stop, "never"], emit=got.sink(0))
    engine.submit(r)
    got.wait()
    engine.stop()
    assert r.finish_reason == "stop"
    assert got.text(0) == r.text == full[: full.find(stop)]
    assert stop not in got.text(0)


def test_a_cancelled_request_frees_its_row_and_the_others_go_on(
    engines: Callable[..., Engine],
) -> None:
    m = lm()
    engine = engines(m, max_batch=2).start()
    got = Collector()
    gate = threading.Event()
    first = Request([1, 2, 3], 50, GREEDY, emit=got.sink(0))

    def slow(event: Event) -> None:  # the second request cancels itself after 3 tokens
        got_sink(event)
        if event.kind == "token" and len(second.tokens) == 3:
            second.cancel()
            gate.set()

    got_sink = got.sink(1)
    second = Request([4, 5], 50, GREEDY, emit=slow)
    engine.submit(first)
    engine.submit(second)
    assert gate.wait(30)
    third = Request([6], 5, GREEDY, emit=got.sink(2))  # takes the freed row
    engine.submit(third)
    got.wait()
    engine.stop()
    assert second.finish_reason == "cancelled" and len(second.tokens) <= 4
    assert first.finish_reason == "length" and len(first.tokens) == 50
    assert third.tokens == generate(m, [[6]], max_new_tokens=5, sampling=GREEDY)[0]
    assert first.tokens == generate(m, [[1, 2, 3]], max_new_tokens=50, sampling=GREEDY)[0]


def test_the_engine_survives_requests_that_raise(engines: Callable[..., Engine]) -> None:
    m = lm()
    engine = engines(m, max_batch=4).start()
    got = Collector()

    def broken(event: Event) -> None:
        raise RuntimeError("the client's callback broke")

    bad_ids = Request([3, 99], 5, GREEDY, emit=got.sink(0))  # 99 is outside the vocabulary
    raising = Request([1, 2], 5, GREEDY, emit=broken)
    good = Request([1, 2], 5, GREEDY, emit=got.sink(2))
    for r in (bad_ids, raising, good):
        engine.submit(r)
    got.wait()
    assert got.events[0][-1].kind == "error" and "99" in got.events[0][-1].text
    assert raising.finish_reason == "error"
    assert good.tokens == generate(m, [[1, 2]], max_new_tokens=5, sampling=GREEDY)[0]
    assert engine.alive and len(engine.free_rows) == 4
    engine.stop()


def test_a_request_whose_sampling_fails_adds_no_tokens_to_the_count(
    engines: Callable[..., Engine], monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    import aiayn.serve.engine as engine_module

    broken = SamplingConfig(temperature=0.5, top_k=3)
    real = engine_module.choose_next

    def choose(logits, config, **kw):  # type: ignore[no-untyped-def]
        if config == broken:
            raise RuntimeError("the sampler broke")
        return real(logits, config, **kw)

    monkeypatch.setattr(engine_module, "choose_next", choose)
    engine = engines(lm(), max_batch=2).start()
    got = Collector()
    engine.submit(Request([1, 2], 5, broken, emit=got.sink(0)))
    engine.submit(Request([1, 2], 5, GREEDY, emit=got.sink(1)))
    got.wait()
    assert got.events[0][-1].kind == "error" and "the sampler broke" in got.events[0][-1].text
    assert engine.stats["tokens"] == 5  # the good request's; the failed one made none
    engine.stop()


def test_a_long_prefill_does_not_stall_running_requests(engines: Callable[..., Engine]) -> None:
    """A 60-token prompt is read 4 tokens per step: the running request keeps getting a token
    every step meanwhile."""
    m = lm()
    engine = engines(m, max_batch=2, prefill_chunk=4)
    order: list[str] = []
    started = threading.Event()

    def run(event: Event) -> None:
        order.append("run")
        if len(order) == 2:
            started.set()

    running = Request([1], 40, GREEDY, emit=run)
    long = Request(
        list(range(26)) * 2 + list(range(8)), 3, GREEDY, emit=lambda e: order.append("long")
    )
    engine.submit(running)
    engine.start()
    assert started.wait(30)
    engine.submit(long)
    got = Collector()
    last = Request([2], 1, GREEDY, emit=got.sink(0))
    engine.submit(last)
    got.wait()
    engine.stop()
    assert long.finish_reason == "length"
    between = order[order.index("run", 1) + 1 : order.index("long")].count("run")
    assert between >= 60 // 4 - 1  # a running token for every prefill chunk


def test_a_full_queue_is_refused(engines: Callable[..., Engine]) -> None:
    """One row, busy (its request's callback blocks the engine), one waiting: the next is a
    QueueFull."""
    m = lm()
    engine = engines(m, max_batch=1, max_queue=1).start()
    release, busy = threading.Event(), threading.Event()

    def block(event: Event) -> None:
        busy.set()
        release.wait(30)

    try:
        engine.submit(Request([1], 2, GREEDY, emit=block))
        assert busy.wait(30)
        engine.submit(Request([1], 1))  # waits for the row
        with pytest.raises(QueueFull, match="max_queue=1"):
            engine.submit(Request([1], 1))
    finally:
        release.set()  # the engine's thread is free to stop, pass or fail
    engine.stop()


def test_a_request_cancelled_in_prefill_gives_its_row_back(engines: Callable[..., Engine]) -> None:
    """Cancelled after the first of 26 prefill chunks: its row is free again at once, and the
    next request decodes in it."""
    m = lm()
    engine = engines(m, max_batch=1, prefill_chunk=2)
    got = Collector()
    first = Request(list(range(26)) * 2, 5, GREEDY, emit=got.sink(0))
    chunks = 0
    read_chunk = engine._prefill_chunk

    def cancel_after_one() -> None:
        nonlocal chunks
        chunks += 1
        if chunks == 2:
            first.cancel()
        read_chunk()

    engine._prefill_chunk = cancel_after_one  # type: ignore[method-assign]
    engine.submit(first)
    engine.start()
    got.wait()
    assert first.finish_reason == "cancelled" and not first.tokens and first.prefilled == 2
    later = Request([1, 2], 4, GREEDY, emit=got.sink(1))
    engine.submit(later)
    got.wait(timeout=30)
    engine.stop()
    assert later.tokens == generate(m, [[1, 2]], max_new_tokens=4, sampling=GREEDY)[0]
    assert engine.free_rows == [0]


def test_a_bad_seed_fails_alone_and_the_earliest_stop_string_wins(
    engines: Callable[..., Engine],
) -> None:
    m = lm()
    p = prompts(1, seed=8)[0]  # its greedy text: 12 n, then k
    full = decode(generate(m, [p], max_new_tokens=30, sampling=GREEDY)[0])
    later, earlier = full[12:14], full[10:13]  # listed first, but found second
    assert full.find(later) == 12 and full.find(earlier) == 10
    engine = engines(m).start()
    got = Collector()
    bad = Request(p, 5, SamplingConfig(temperature=1.0), seed=2**64, emit=got.sink(0))
    good = Request(p, 30, GREEDY, stop=[later, earlier], emit=got.sink(1))
    engine.submit(bad)
    engine.submit(good)
    got.wait()
    assert got.events[0][-1].kind == "error" and "Overflow" in got.events[0][-1].text
    assert good.text == full[:10] and good.finish_reason == "stop"
    assert engine.alive
    engine.stop()


@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_incremental_text_equals_decoding_everything_at_every_token(kind: str) -> None:
    """The engine decodes only the newest tokens at each step; the text must be what decoding
    the whole list gives, token by token, across characters split over several byte-level
    tokens (umlauts, Japanese, emoji) and a tokenizer that drops the first leading space."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from aiayn.serve.stream_text import incremental_text

    text = (
        "Fünf Leute stehen im Schnee. 日本語の文章です。 Ein Hund läuft 🐕 über grünes Gras! " * 3
    )
    tok = Tokenizer(models.BPE())
    if kind == "byte-level":
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(), decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        alphabet = []
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet))
    encoded = tok.encode(text).ids
    g = torch.Generator().manual_seed(0)
    randoms = torch.randint(0, tok.get_vocab_size(), (200,), generator=g).tolist()
    lengths: list[int] = []

    def decode(ids: list[int]) -> str:
        lengths.append(len(ids))
        return tok.decode(ids)

    for ids in (encoded, randoms):
        r = Request(prompt=[0], max_new_tokens=len(ids))
        for token in ids:
            r.tokens.append(token)
            lengths.clear()
            assert incremental_text(r, decode) == tok.decode(r.tokens)
        assert r.decoded_upto > len(ids) - 4  # it kept up ...
        assert max(lengths) < 8  # ... decoding a few tokens per step, not the whole text


def test_the_held_back_tail_is_the_longest_stop_prefix_the_text_ends_with() -> None:
    """Against the definition, by brute force, on random texts and stop strings over two
    letters (where prefixes overlap most: the failure function's hard cases), and on a stop
    string longer than the text."""
    from aiayn.serve.stream_text import held_back

    def brute(text: str, stops: list[str]) -> int:
        longest = 0
        for s in stops:
            for n in range(1, min(len(s) - 1, len(text)) + 1):
                if text.endswith(s[:n]):
                    longest = max(longest, n)
        return longest

    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choices("ab", k=rng.randint(0, 12)))
        stops = ["".join(rng.choices("ab", k=rng.randint(1, 8))) for _ in range(rng.randint(1, 3))]
        assert held_back(text, stops) == brute(text, stops), (text, stops)
    assert held_back("xyab", ["abab" * 10_000]) == 2
