"""A decoding step without the interpreter: one token per row, captured once per batch size.

An eager decoding step is the model's forward pass run op by op from Python: at batch 1 a
GPT-2-small step with int8 weights is some 600 PyTorch calls, and on a CPU the time between
them rivals the time in them.  gpt-fast showed the cure on GPUs: make every shape of the step
fixed (a static KV cache, aiayn/nn/static_cache.py) and compile the step once, so that it runs
as one function.  Here that function is ``model(tokens, cache=static)[:, -1]`` compiled by
``torch.compile`` with ``fullgraph=True`` (no graph break is allowed: a break would put the
interpreter back between the pieces):

* on a CPU, inductor fuses the step's element-wise work into C++/OpenMP loops around the
  matrix products, which stay the eager step's kernels, held by the graph as operators: int8
  products fbgemm's (aiayn/nn/int8_kernel.py), fp32 products oneDNN's on the weights the
  decoding block packed, and one row BLAS's gemv (aiayn/nn/fp32_kernels.py);
* on CUDA, the same code with CUDA graphs (``mode="reduce-overhead"``).

The step is compiled once per batch size (every other shape is fixed by the cache's capacity)
and inductor keeps what it compiled on disk (its FX graph cache, under
``$AIAYN_CACHE/inductor`` unless ``TORCHINDUCTOR_CACHE_DIR`` says otherwise), so a second
process with the same shapes loads the step instead of compiling it.  ``CapturedStep``
reports how long each batch size took to capture.

The prompt (many tokens, a new length each time) runs eagerly into the same static cache; only
the one-token step is captured (and, in beam search, the selection that follows it:
aiayn/generate/beam.py).  ``compile="auto"`` captures where it measured faster, for a job
long enough to pay for the capture (``wants_capture``); ``"on"`` always, where the model
allows; ``"off"`` never.

Shapes: B batch, V vocabulary.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.data.download import default_cache
from aiayn.errors import UserError
from aiayn.models.encoder_decoder import EncoderDecoder
from aiayn.nn import native_ops
from aiayn.nn.static_cache import StaticCache
from aiayn.nn.static_cache import supports as static_supports

COMPILE_CHOICES = ("auto", "on", "off")


def check_compile(setting: str) -> str:
    if setting not in COMPILE_CHOICES:
        raise UserError(f"compile={setting!r} is invalid: expected one of auto, on, off")
    return setting


def use_inductor_cache() -> str:
    """Point inductor's on-disk cache at aiayn's cache folder unless the user chose one;
    returns the folder.  Inductor writes its default (a temporary folder) into the variable
    the first time anything asks, so that value counts as unset."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(default_cache() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


CAPTURE_ROWS = 8  # auto captures a CPU step of at most this many rows
# auto captures a job of at least this many decoding steps.  A capture is paid in every
# process, even when inductor's disk cache holds it (dynamo traces the model again and imports
# the compiler), and a captured step saves a few milliseconds: it pays from about a thousand
# steps (docs/performance.md, "Which jobs auto captures").
CAPTURE_MIN_STEPS = 1024


def wants_capture(model: nn.Module, setting: str, rows: int, steps: int) -> bool:
    """Whether a decoding job of ``steps`` steps (every generation or search of the process's
    job, together) at ``rows`` rows per step captures ``model``'s step under ``setting``.

    ``auto`` captures where ``benchmarks/decoding.py`` measured the captured step faster than
    the eager one, and where the job is long enough to pay for the capture
    (``CAPTURE_MIN_STEPS``): on CUDA, and on a CPU at up to ``CAPTURE_ROWS`` rows (a batch of
    a few prompts, one or two sentences' beams), where the time between operations is a large
    share of a step.  Both steps run the same products; with hundreds of rows (Marian-small,
    beam 4, batch 64) the captured step was slower in five of six comparisons, since it
    attends over every slot of its static cache and over a source padded to a multiple of 32.
    A short job (a sentence to translate, a reply of a few hundred tokens) decodes eagerly:
    the capture would take longer than the whole job.  Models the static cache cannot hold
    are never captured."""
    check_compile(setting)
    if setting == "off" or static_supports(model) is not None:
        return False
    if setting == "on":
        return True
    if steps < CAPTURE_MIN_STEPS:
        return False
    device = next(model.parameters()).device.type
    return device == "cuda" or (device == "cpu" and rows <= CAPTURE_ROWS)


def compile_options(device: str) -> dict[str, str | int | bool | Callable[..., Any]]:
    """Inductor's options for a captured function on ``device`` (the step, and beam search's
    selection):

    * inductor computes a fused bf16 expression in fp32 and rounds once; eager PyTorch rounds
      after every operation.  Emulating eager's roundings keeps the tokens identical;
    * on a CPU, the generated code that calls the kernels is C++ (``cpp_wrapper``), not
      Python: a step calls some forty products and as many fused loops, and the Python
      between them was measurable in every step (docs/performance.md, "On an Intel Xeon with
      AMX");
    * on CUDA, the step is replayed as a CUDA graph (what ``mode="reduce-overhead"`` sets)."""
    return {
        "emulate_precision_casts": True,
        "cpp_wrapper": device == "cpu",
        "triton.cudagraphs": device == "cuda",
    }


def _step(model: nn.Module, tokens: Tensor, cache: StaticCache, threads: int) -> Tensor:
    """(B, 1) tokens -> (B, V) next-token logits, writing their keys into ``cache``: a
    decoder-only model's forward, or an encoder-decoder's decoder after its first step (the
    cross-attention keys and values are in the cache).  ``threads`` is unused but guarded:
    inductor builds its loops for the thread count it compiles under, so each count gets its
    own capture."""
    if isinstance(model, EncoderDecoder):
        return model.decode(tokens, None, None, cache=cache)[:, -1]
    return model(tokens, cache=cache)[:, -1]


class CapturedStep:
    """The one-token decoding step of ``model``, compiled once per batch size."""

    def __init__(self, model: nn.Module) -> None:
        cache = use_inductor_cache()
        # One capture per (batch size, thread count, cache size): more than dynamo's default
        # of 8 per function, past which it would run the step eagerly.
        for name in ("recompile_limit", "accumulated_recompile_limit"):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
        self.model = weakref.ref(model)  # the step does not keep its model alive
        device = next(model.parameters()).device.type
        if device == "cpu":
            native_ops.load(Path(cache))  # the products without the interpreter
        self.fn = torch.compile(
            _step, fullgraph=True, dynamic=False, options=compile_options(device)
        )
        # (batch size, threads, cache slots) -> seconds of the first call, the capture included
        self.capture_seconds: dict[tuple[int, int, int], float] = {}

    def __call__(self, tokens: Tensor, cache: StaticCache) -> Tensor:
        """(B, 1) tokens -> (B, V) logits; the cache must have a free slot."""
        model = self.model()
        assert model is not None, "a captured step outlived its model"
        cache.reserve(1)
        threads = torch.get_num_threads()
        key = tokens.shape[0], threads, cache.capacity
        if key in self.capture_seconds:
            return self.fn(model, tokens, cache, threads)
        start = time.perf_counter()
        logits = self.fn(model, tokens, cache, threads)
        self.capture_seconds[key] = time.perf_counter() - start
        return logits


_STEPS: weakref.WeakKeyDictionary[nn.Module, CapturedStep] = weakref.WeakKeyDictionary()


def captured_step(model: nn.Module) -> CapturedStep:
    """``model``'s captured step, made once per model and process."""
    step = _STEPS.get(model)
    if step is None:
        step = _STEPS[model] = CapturedStep(model)
    return step


def capture_seconds(model: nn.Module) -> dict[tuple[int, int, int], float]:
    """The captures of ``model``'s step so far in this process (``CapturedStep.capture_seconds``,
    a copy); none where no step was made.  Reading them makes no step: a step's
    ``torch.compile`` costs a second or more to set up."""
    step = _STEPS.get(model)
    return {} if step is None else dict(step.capture_seconds)


def compile_counters() -> dict[str, Any]:
    """Inductor's FX graph cache hits and misses in this process (a miss compiled)."""
    from torch._dynamo.utils import counters

    return {k: int(v) for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}
