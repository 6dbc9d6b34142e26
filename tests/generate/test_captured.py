"""The static KV cache and the captured decoding step: the same tokens as eager decoding.

The static cache is checked against the growing one step by step (no compiler involved); the
captured step against eager generation at fp32, bf16 and int8, with no graph break, and a
second capture of the same shapes is loaded from inductor's disk cache instead of compiled.
"""

from __future__ import annotations

import pytest
import torch

from aiayn.generate import SamplingConfig, generate
from aiayn.generate.beam import BeamConfig, beam_search, search_steps
from aiayn.generate.captured import (
    CAPTURE_MIN_STEPS,
    CAPTURE_ROWS,
    _step,
    captured_step,
    compile_counters,
    wants_capture,
)
from aiayn.generate.threads import SMALL_STEP, decode_threads, step_macs
from aiayn.generate.translate import compile_for_job
from aiayn.models import DecoderLM, EncoderDecoder
from aiayn.models.precision import Precision, apply_precision
from aiayn.nn.cpu_decoding import for_decoding
from tests.conftest import tiny_model

GREEDY = SamplingConfig(temperature=0)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [1], [20, 21, 22]]  # left-padded into one batch


def small(preset: str = "gpt2-small", **kw: object) -> DecoderLM:
    model = tiny_model(preset, **{"vocab_size": 40, "max_len": 64, "init_std": 0.2, **kw})
    assert isinstance(model, DecoderLM)
    return model


def small_mt() -> EncoderDecoder:
    model = tiny_model("paper-base", vocab_size=24, max_len=64, init_std=0.3)
    assert isinstance(model, EncoderDecoder)
    return model


def _left_padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    p = max(map(len, prompts))
    ids = torch.tensor([[0] * (p - len(r)) + r for r in prompts])
    keep = torch.tensor([[False] * (p - len(r)) + [True] * len(r) for r in prompts])
    return ids, keep


@pytest.mark.parametrize("preset", ["gpt2-small", "llama-style-small"])
def test_static_cache_gives_the_growing_caches_logits(preset: str) -> None:
    """Left-padded prompts, then ten steps: every logit of the static cache (all slots read,
    the unfilled ones masked) equals the growing cache's within fp32 rounding.  Then a beam
    reorder of both keeps them equal."""
    model = small(preset)
    ids, keep = _left_padded(PROMPTS)
    grow, static = model.new_cache(3, 40), model.new_static_cache(3, 40)
    with torch.no_grad():
        a = model(ids, attention_mask=keep, cache=grow)[:, -1]
        static.reserve(ids.shape[1])
        b = model(ids, attention_mask=keep, cache=static)[:, -1]
        for i in range(10):
            # fp32: the same sums over a different number of masked (zero-weight) keys
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
            nxt = a.argmax(-1)[:, None]
            if i == 5:  # beam search's reorder: rows 2, 0, 0
                index = torch.tensor([2, 0, 0])
                grow.reorder(index)
                static.reorder(index)
                nxt = nxt[index]
            a = model(nxt, cache=grow)[:, -1]
            static.reserve(1)
            b = model(nxt, cache=static)[:, -1]


def test_static_cache_refuses_what_it_cannot_hold() -> None:
    model = small()
    cache = model.new_static_cache(1, 8)
    cache.reserve(8)
    with pytest.raises(ValueError, match="static KV cache is full: 8 cached \\+ 1 new"):
        cache.reserve(1)
    with pytest.raises(ValueError, match="capacity 65 exceeds the model's max_len=64"):
        model.new_static_cache(1, 65)
    window = small("llama-style-small", **{"attention.sliding_window": 4})
    with pytest.raises(ValueError, match="sliding window needs the rolling cache"):
        window.new_static_cache(1, 8)
    assert not wants_capture(window, "on", 1, 1)  # it decodes eagerly instead


def test_auto_captures_small_steps_of_a_long_job_on_a_cpu() -> None:
    """auto: a step of up to CAPTURE_ROWS rows on a CPU, whatever the precision, in a job of
    at least CAPTURE_MIN_STEPS steps; on and off as they say, whatever the job."""
    model = small()
    int8 = apply_precision(small(), torch.device("cpu"), Precision(quantize="int8"))
    long = CAPTURE_MIN_STEPS
    for m in (model, int8):
        assert wants_capture(m, "auto", 1, long) and wants_capture(m, "auto", CAPTURE_ROWS, long)
        assert not wants_capture(m, "auto", CAPTURE_ROWS + 1, long)
        assert not wants_capture(m, "auto", 1, long - 1)  # the capture would not pay
        assert wants_capture(m, "on", 64, 1) and not wants_capture(m, "off", 1, long)
    with pytest.raises(ValueError, match="compile='yes' is invalid: expected one of auto, on"):
        wants_capture(model, "yes", 1, long)


def test_a_short_generation_or_search_decodes_eagerly_under_auto() -> None:
    """No capture for a few steps: neither ``generate`` nor ``beam_search`` compiles."""
    model = small()
    generate(model, PROMPTS, max_new_tokens=4, sampling=GREEDY, compile="auto")
    assert not captured_step(model).capture_seconds
    mt = small_mt()
    beam_search(mt, torch.tensor([[3, 4, 5, 2]]), bos=1, eos=2, config=BeamConfig(beam_size=2))
    assert not captured_step(mt).capture_seconds


def test_translate_decides_auto_for_the_whole_job() -> None:
    """A file of one-sentence batches captures once its searches together reach
    CAPTURE_MIN_STEPS steps; one sentence alone, or batches of too many rows, do not."""
    model, beam = small_mt(), BeamConfig(beam_size=4, max_extra=10)
    steps = search_steps(model, 6, beam)  # a batch of sources of at most 6 tokens
    assert steps == 16
    enough = [[6]] * -(-CAPTURE_MIN_STEPS // steps)
    assert compile_for_job(model, "auto", 4, enough, beam) == "on"
    assert compile_for_job(model, "auto", 4, enough[:-1], beam) == "off"
    assert compile_for_job(model, "auto", 4, [[6]], beam) == "off"
    assert compile_for_job(model, "auto", 4 * CAPTURE_ROWS, enough, beam) == "off"
    assert compile_for_job(model, "on", 4, [[6]], beam) == "on"
    assert compile_for_job(model, "off", 4, enough, beam) == "off"


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["gpt2-small", "llama-style-small"])
def test_captured_greedy_equals_eager(preset: str) -> None:
    """fp32: the captured step gives eager decoding's tokens for a left-padded batch and for
    each prompt alone (batched = unbatched on the captured path too)."""
    model = small(preset)
    eager = generate(model, PROMPTS, max_new_tokens=20, sampling=GREEDY, compile="off")
    captured = generate(model, PROMPTS, max_new_tokens=20, sampling=GREEDY, compile="on")
    assert captured == eager
    alone = [
        generate(model, [p], max_new_tokens=20, sampling=GREEDY, compile="on")[0] for p in PROMPTS
    ]
    assert alone == eager


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_captured_low_precision_equals_eager(precision: str) -> None:
    """int8 (fbgemm's kernel inside the graph, as a custom operator) and bf16: the same tokens
    as the eager step for the same batch, and sampling with a seed draws the same tokens."""
    setting = Precision(quantize="int8") if precision == "int8" else Precision(dtype="bfloat16")
    model = apply_precision(small(), torch.device("cpu"), setting)
    for sampling, seed in ((GREEDY, None), (SamplingConfig(temperature=0.8, top_k=10), 3)):
        eager = generate(
            model, PROMPTS, max_new_tokens=16, sampling=sampling, seed=seed, compile="off"
        )
        captured = generate(
            model, PROMPTS, max_new_tokens=16, sampling=sampling, seed=seed, compile="on"
        )
        assert captured == eager


@pytest.mark.slow
def test_the_int8_step_captures_whole_and_loads_from_disk_the_second_time() -> None:
    """``torch._dynamo.explain`` of the int8 step finds one graph and no break (the int8
    product is a custom operator, not an opaque object); after the compiler forgets it, the
    same shapes are loaded from inductor's FX graph cache: a hit, and no new compile."""
    model = apply_precision(small(), torch.device("cpu"), Precision(quantize="int8"))
    ids, keep = _left_padded(PROMPTS)
    with torch.no_grad(), for_decoding(model, 3):
        cache = model.new_static_cache(3, 32)
        cache.reserve(ids.shape[1])
        model(ids, attention_mask=keep, cache=cache)
        cache.reserve(1)
        explained = torch._dynamo.explain(_step)(model, ids[:, -1:], cache, torch.get_num_threads())
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    generate(model, PROMPTS, max_new_tokens=4, sampling=GREEDY, compile="on")
    before = compile_counters()
    torch._dynamo.reset()
    generate(model, PROMPTS, max_new_tokens=4, sampling=GREEDY, compile="on")
    after = compile_counters()
    assert after.get("fxgraph_cache_hit", 0) > before.get("fxgraph_cache_hit", 0)
    assert after.get("fxgraph_cache_miss", 0) == before.get("fxgraph_cache_miss", 0)


def test_threads_auto_gives_small_steps_one_thread() -> None:
    """The rule, not the speed: one thread below SMALL_STEP multiply-adds a step, every core
    at and above it; a number is taken as it is."""
    model = small()
    per_row = step_macs(model, 1)
    assert step_macs(model, 8) == 8 * per_row
    assert decode_threads("auto", model, 1, cores=2) == 1
    big_rows = SMALL_STEP // per_row + 1
    assert decode_threads("auto", model, big_rows, cores=2) == 2
    assert decode_threads("auto", model, big_rows - 1, cores=2) == 1
    assert decode_threads("3", model, 1) == 3 and decode_threads(4, model, 1) == 4
    with pytest.raises(ValueError, match="threads='0' is invalid: expected 'auto' or a count"):
        decode_threads("0", model, 1)
    with pytest.raises(ValueError, match="threads='many' is invalid"):
        decode_threads("many", model, 1)
