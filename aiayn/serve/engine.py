"""The engine: one loop that owns the model and decodes every running request together.

Continuous batching (Yu et al., 2022, Orca; vLLM, TGI): requests do not wait for a batch to
fill or to finish.  Each turn of the loop

1. admits waiting requests while rows of the ``SlotPool`` are free;
2. runs one chunk (at most ``prefill_chunk`` tokens) of the oldest admitted request's prompt
   into its row -- chunked prefill, so a long prompt delays the running requests by one
   chunk per step, not by its whole length;
3. runs one decoding step for every running request at once: (n, 1) ids through the model's
   ordinary forward pass over the pool's first n rows;
4. chooses each request's next token with that request's own sampling settings and random
   generator, and finishes the requests that are done (EOS, a stop string, the length limit,
   or a cancelled client), freeing their rows at once.

A decoding step costs about the same for one row as for several on a CPU or GPU (it is bound
by reading the weights), which is where the throughput comes from.

Requests talk to the engine through callbacks (``emit``), called on the engine's thread; the
HTTP layer (aiayn/serve/app.py) turns them into server-sent events.  A request that raises
(in its sampling, its stop strings or its callback) fails alone; the engine carries on.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aiayn.errors import RequestError
from aiayn.generate.penalties import Penalties
from aiayn.generate.sampling import SamplingConfig, choose_next
from aiayn.models import DecoderLM
from aiayn.nn.cpu_decoding import for_decoding
from aiayn.serve.slots import SlotPool
from aiayn.serve.stream_text import held_back, incremental_text


def _top(logprobs: Tensor, n: int) -> dict[int, float]:
    """The ``n`` most likely token ids of a (V,) row of log-probabilities, with theirs."""
    if n == 0:
        return {}
    values, ids = logprobs.topk(n)
    return dict(zip(ids.tolist(), values.tolist(), strict=True))


class QueueFull(RuntimeError):
    """The waiting queue is at its limit (HTTP 429)."""


class EngineStopped(RuntimeError):
    """The engine is not running (HTTP 503)."""


@dataclass
class Event:
    """What a request hears: ``kind`` "token" (``text`` is the new text, possibly empty while
    a stop string may still be forming), "done" (``finish_reason``) or "error" (``text``)."""

    kind: str
    text: str = ""
    token: int | None = None
    finish_reason: str | None = None
    logprob: float | None = None  # the token's, when the request asks for log-probabilities
    top: dict[int, float] | None = None  # the most likely tokens' (``Request.logprobs`` of them)


@dataclass(eq=False)  # requests are compared by identity (in lists, queues)
class Request:
    """One completion: the prompt's ids and how to continue it.  ``emit`` receives the
    ``Event`` s, on the engine's thread."""

    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    stop: Sequence[str] = ()
    emit: Callable[[Event], None] = lambda event: None
    logprobs: int | None = None  # record log-probabilities, with this many top alternatives
    echo: bool = False  # record the prompt's log-probabilities too (OpenAI's echo)
    penalties: Penalties = field(default_factory=Penalties)
    id: int = field(default_factory=itertools.count().__next__)
    # Filled in by the engine.
    tokens: list[int] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[float | None] = field(default_factory=list)  # with echo; [0] is None
    prompt_top: list[dict[int, float] | None] = field(default_factory=list)
    counts: Tensor | None = None  # (1, V) generated tokens, for the penalties
    bias: Tensor | None = None  # (V,) logit_bias
    text: str = ""  # the text emitted so far
    finish_reason: str | None = None
    cancelled: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    finished: float | None = None
    row: int | None = None
    prefilled: int = 0
    cache: Any = None  # the row's cache during prefill
    generator: torch.Generator | None = None
    seen: Tensor | None = None  # (1, V) for the repetition penalty
    decoded: str = ""  # the text of tokens[:decoded_upto] (incremental_text)
    decode_from: int = 0
    decoded_upto: int = 0

    def cancel(self) -> None:
        """Stop this request at the next step (a client went away); its row is freed then."""
        self.cancelled = True

    @property
    def records(self) -> bool:
        """Whether this request's log-probabilities are recorded."""
        return self.logprobs is not None or self.echo

    @property
    def cumulative_logprob(self) -> float:
        return float(sum(self.token_logprobs))


class Engine:
    """The loop of the module docstring, on a thread of its own (``start``)."""

    def __init__(
        self,
        model: DecoderLM,
        decode: Callable[[list[int]], str],
        *,
        max_batch: int = 16,
        max_queue: int = 256,
        prefill_chunk: int = 128,
        eos_id: int | Sequence[int] | None = None,
        batching: bool = True,
        context: int | None = None,
    ) -> None:
        if prefill_chunk < 1 or max_batch < 1 or max_queue < 0:
            raise RequestError(
                f"prefill_chunk={prefill_chunk} and max_batch={max_batch} must be >= 1,"
                f" max_queue={max_queue} >= 0"
            )
        self.model = model.eval()
        self.threads = torch.get_num_threads()
        self.decode, self.prefill_chunk = decode, prefill_chunk
        # the ids that end a request (any of them: a chat model's end of turn and of text)
        self.eos = frozenset([eos_id] if isinstance(eos_id, int) else eos_id or ())
        self.max_batch = max_batch if batching else 1
        self.max_queue = max_queue
        self.pool = SlotPool(model, self.max_batch, context)  # rows of `context` positions
        self.device = next(model.parameters()).device
        self.gemv = False  # one row on BLAS's gemv: known once the loop's block is entered
        self.waiting: collections.deque[Request] = collections.deque()
        self.prefilling: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []  # request i holds pool row i
        self.free_rows = list(range(self.max_batch - 1, -1, -1))
        self.lock = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.failure: BaseException | None = None
        self.stats = collections.Counter[str]()
        self.recent: collections.deque[tuple[float, int]] = collections.deque()  # (time, tokens)

    # ----- the outside world (any thread) ----------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queue ``request``; raises ``QueueFull`` or ``EngineStopped``."""
        with self.lock:
            if self.stopping or self.failure is not None:
                raise EngineStopped(f"the engine is not running: {self.failure or 'stopped'}")
            if len(self.waiting) >= self.max_queue + len(self.free_rows):
                raise QueueFull(
                    f"{len(self.waiting)} requests are already waiting for a row"
                    f" (max_queue={self.max_queue}, max_batch={self.max_batch})"
                )
            self.waiting.append(request)
            self.stats["requests"] += 1
            self.lock.notify()

    @property
    def accepting(self) -> bool:
        """Requests are taken (those submitted before the loop starts wait for it)."""
        return not self.stopping and self.failure is None

    @property
    def alive(self) -> bool:
        """The loop runs (requests submitted before ``start`` wait for it)."""
        return self.thread is not None and self.thread.is_alive() and not self.stopping

    def start(self) -> Engine:
        """Run the loop on a thread of its own."""
        self.thread = threading.Thread(target=self.run, name="aiayn-engine", daemon=True)
        self.thread.start()
        return self

    def run(self) -> None:
        """Run the loop in the calling thread until ``stop`` (or Ctrl-C).

        ``aiayn serve`` runs it in the process's main thread, the one that built the model,
        and the HTTP server on another: torch's OpenMP workers then form one team.  A second
        team, started from another thread, makes libgomp count more threads than cores and
        stop spinning between parallel regions; on 2 cores that doubled the time of a
        16-row decoding step."""
        self.thread = threading.current_thread()
        with suppress(KeyboardInterrupt):
            self._loop()

    def stop(self, wait: bool = True) -> None:
        """End the loop (the requests still in it hear an error) and, with ``wait``, wait for
        it."""
        with self.lock:
            self.stopping = True
            self.lock.notify()
        if wait and self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()

    def gauges(self) -> dict[str, float]:
        """What /metrics reports (read without stopping the loop)."""
        now = time.perf_counter()
        window = [n for t, n in list(self.recent) if now - t <= 10.0]
        return {
            "queue_depth": len(self.waiting),
            "running": len(self.running),
            "prefilling": len(self.prefilling),
            "slots_in_use": self.max_batch - len(self.free_rows),
            "slots_total": self.max_batch,
            "tokens_per_second": sum(window) / 10.0,
        }

    # ----- the loop (the engine's thread) ----------------------------------------------------

    def _loop(self) -> None:
        threads = self.threads
        try:
            # Several rows per step are a small matrix product, which oneDNN does far faster
            # from a weight packed once (aiayn/nn/cpu_kernels.py), as generate() does.
            with torch.inference_mode(), for_decoding(self.model, self.max_batch) as plan:
                self.gemv = plan.gemv
                while True:
                    with self.lock:
                        while not (
                            self.stopping or self.waiting or self.prefilling or self.running
                        ):
                            self.lock.wait()
                        if self.stopping:
                            break
                        ended = self._admit()
                    for r, reason, error in ended:
                        self._finish(r, reason, error)
                    self._prefill_chunk()
                    self._decode_step()
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # the loop itself broke: every request hears it
            self.failure = err
            for r in [*self.waiting, *self.prefilling, *self.running]:
                self._finish(r, None, error=f"engine failure: {err}")
            raise
        finally:
            torch.set_num_threads(threads)
            with self.lock:
                self.stopping = True
                pending = [*self.waiting, *self.prefilling, *self.running]
            for r in pending:
                if r.finish_reason is None:
                    self._finish(r, None, error="the server is shutting down")

    def _admit(self) -> list[tuple[Request, str | None, str | None]]:
        """Move waiting requests to prefill, one at a time (the prefilling row must not sit
        where the running rows grow: it joins them at the end of its prefill).  Called under
        the lock; returns the requests that end here (cancelled, or their setup failed), to be
        told outside it."""
        ended: list[tuple[Request, str | None, str | None]] = []
        for r in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(r)
            ended.append((r, "cancelled", None))
        while self.waiting and self.free_rows and not self.prefilling:
            r = self.waiting.popleft()
            try:
                self._set_up(r)
            except Exception as err:  # a bad seed or token id: this request fails alone
                ended.append((r, None, f"{type(err).__name__}: {err}"))
                continue
            r.row = self.free_rows.pop()
            self.pool.lengths[r.row] = 0
            r.cache = self.pool.row_cache(r.row)
            self.prefilling.append(r)
        return ended

    def _set_up(self, r: Request) -> None:
        """A request's generator, its repetition and OpenAI penalties' state, and the null
        log-probability of its first prompt token."""
        vocab = self.model.config.vocab_size
        if r.seed is not None:
            r.generator = torch.Generator(device=self.device).manual_seed(r.seed)
        if r.sampling.repetition_penalty != 1.0:
            r.seen = torch.zeros(1, vocab, dtype=torch.bool)
            r.seen[0, r.prompt] = True
        if r.penalties.presence or r.penalties.frequency:
            r.counts = torch.zeros(1, vocab, device=self.device)
        r.bias = r.penalties.bias_vector(vocab, self.device)
        if r.echo:
            r.prompt_logprobs, r.prompt_top = [None], [None]

    def _prefill_chunk(self) -> None:
        """One chunk of the oldest prefilling request's prompt into its row."""
        while self.prefilling and self.prefilling[0].cancelled:
            self._release(self.prefilling[0], "cancelled")  # frees its row
        if not self.prefilling:
            return
        r = self.prefilling[0]
        chunk = r.prompt[r.prefilled : r.prefilled + self.prefill_chunk]
        self._threads_for(len(chunk))
        try:
            ids = torch.tensor([chunk], device=self.device)
            every = self.model(ids, cache=r.cache, last_only=not r.echo)  # (1, T|1, V)
            if r.echo:
                self._record_prompt(r, every[0], r.prefilled)
            logits = every[:, -1]  # (1, V)
        except Exception as err:  # e.g. an id outside the vocabulary: this request fails
            self._release(r, None, error=f"{type(err).__name__}: {err}")
            return
        r.prefilled += len(chunk)
        self.pool.lengths[r.row] = r.prefilled
        if r.prefilled < len(r.prompt):
            return
        self.prefilling.popleft()
        r.cache = None
        # Join the running rows at the front of the pool.
        assert r.row is not None
        target = len(self.running)
        if r.row != target:
            self.pool.move(r.row, target)
            self.free_rows.remove(target)
            self.free_rows.append(r.row)
            r.row = target
        self.running.append(r)
        if r.max_new_tokens == 0:  # the prompt's log-probabilities alone (echo)
            self._release(r, "length")
            return
        self._choose([r], logits)

    def _record_prompt(self, r: Request, logits: Tensor, start: int) -> None:
        """The log-probabilities of the prompt tokens that a chunk's (T, V) ``logits``
        predict: position ``start + j`` predicts prompt token ``start + j + 1``."""
        targets = r.prompt[start + 1 : start + 1 + logits.shape[0]]
        if not targets:
            return
        lp = logits[: len(targets)].float().log_softmax(-1)  # (T', V)
        chosen = lp.gather(-1, torch.tensor(targets, device=lp.device)[:, None])[:, 0]
        r.prompt_logprobs += chosen.tolist()
        r.prompt_top += [_top(row, r.logprobs or 0) for row in lp]

    def _decode_step(self) -> None:
        """One token for every running request."""
        for r in [r for r in self.running if r.cancelled]:
            self._release(r, "cancelled")
        if not self.running:
            return
        n = len(self.running)
        self._threads_for(n)
        try:
            ids = torch.tensor([[r.tokens[-1]] for r in self.running], device=self.device)
            logits = self.model(ids, cache=self.pool.batch_cache(n))[:, -1]  # (n, V)
        except Exception as err:  # the step failed for all of them; the engine goes on
            for r in list(self.running):
                self._release(r, None, error=f"{type(err).__name__}: {err}")
            return
        self._choose(list(self.running), logits)

    def _threads_for(self, rows: int) -> None:
        """One row on a CPU in fp32 goes to BLAS's gemv, which runs on BLAS's own threads:
        torch's small element-wise operations then run on one thread, so that the two thread
        pools do not spin against each other (what generate() does for one sequence)."""
        want = 1 if rows == 1 and self.gemv else self.threads
        if self.device.type == "cpu" and torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def _choose(self, requests: list[Request], logits: Tensor) -> None:
        """Each request's next token from its row of ``logits``, with its own settings."""
        now = time.perf_counter()
        made = 0  # tokens generated: a request that fails here made none
        for i, r in enumerate(requests):
            try:
                token, logprob, top = self._next(r, logits[i : i + 1])
                made += 1
                # counted before _append, which may finish r: a client that reads the
                # metrics once its response is complete must find this token counted
                self.stats["tokens"] += 1
                self._append(r, token, now, logprob, top)
            except Exception as err:  # this request fails alone
                self._release(r, None, error=f"{type(err).__name__}: {err}")
        self.recent.append((now, made))
        while self.recent and now - self.recent[0][0] > 10.0:
            self.recent.popleft()

    def _next(
        self, r: Request, logits: Tensor
    ) -> tuple[int, float | None, dict[int, float] | None]:
        """``r``'s next token from its (1, V) ``logits``, and, if it records them, the token's
        log-probability and the top ones: the model's own distribution, before the penalties,
        the temperature and the filters (as vLLM and OpenAI report them)."""
        shaped = logits
        if r.counts is not None or r.bias is not None:
            counts = r.counts if r.counts is not None else torch.zeros_like(logits)
            shaped = r.penalties.apply(logits.float(), counts, r.bias)
        token = int(choose_next(shaped, r.sampling, seen=r.seen, generator=r.generator))
        if r.seen is not None:
            r.seen[0, token] = True
        if r.counts is not None:
            r.counts[0, token] += 1
        if not r.records:
            return token, None, None
        lp = logits[0].float().log_softmax(-1)  # (V,)
        return token, float(lp[token]), _top(lp, r.logprobs or 0)

    def _append(
        self,
        r: Request,
        token: int,
        now: float,
        logprob: float | None = None,
        top: dict[int, float] | None = None,
    ) -> None:
        if r.first_token is None:
            r.first_token = now
        r.tokens.append(token)
        if logprob is not None and top is not None:
            r.token_logprobs.append(logprob)
            r.top_logprobs.append(top)
        reason = None
        text = incremental_text(r, self.decode)
        if token in self.eos:
            reason, text = "stop", self.decode(r.tokens[:-1])
        else:
            found = [text.find(s, max(0, len(r.text) - len(s))) for s in r.stop]
            found = [at for at in found if at >= 0]
            if found:  # the earliest stop string in the text, whichever is listed first
                reason, text = "stop", text[: min(found)]
        if reason is None and len(r.tokens) >= r.max_new_tokens:
            reason = "length"
        if reason is None and len(r.prompt) + len(r.tokens) >= self.pool.capacity:
            reason = "length"  # the row is full: the model's max_len
        if reason is None:  # hold back what may be an unfinished character or stop string
            text = text.rstrip("\ufffd")
            text = text[: len(text) - held_back(text, r.stop)]
        delta = text[len(r.text) :] if text.startswith(r.text) else ""
        r.text += delta
        r.emit(Event("token", delta, token, logprob=logprob, top=top))
        if reason is not None:
            self._release(r, reason)

    def _release(self, r: Request, reason: str | None, error: str | None = None) -> None:
        """Finish ``r`` and free its row at once: the running rows after it move up one, so
        that they stay in the order they started -- nearly the order of their lengths, which
        lets attention read each group of neighbours only up to its own longest
        (aiayn/serve/slots.py)."""
        if r in self.running:
            i = self.running.index(r)
            last = len(self.running) - 1
            for j in range(i + 1, last + 1):
                self.pool.move(j, j - 1)
                self.running[j].row = j - 1
            self.running.pop(i)
            self.free_rows.append(last)
        elif r in self.prefilling:
            self.prefilling.remove(r)
            assert r.row is not None
            self.free_rows.append(r.row)
        r.row, r.cache = None, None
        self._finish(r, reason, error)

    def _finish(self, r: Request, reason: str | None, error: str | None = None) -> None:
        r.finished = time.perf_counter()
        r.finish_reason = reason or "error"
        self.stats[f"finished_{r.finish_reason}"] += 1
        try:
            if error is not None:
                r.emit(Event("error", error))
            else:
                r.emit(Event("done", finish_reason=reason))
        except Exception:  # a callback that raises loses only its own request
            self.stats["callback_errors"] += 1
