"""The worker behind ``POST /v1/translate``: an encoder-decoder's translation requests, each
a batch of lines through beam search (or greedy), one batch at a time on a worker thread."""

from __future__ import annotations

import asyncio
import collections
import threading

import torch

from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer
from aiayn.generate.beam import BeamConfig
from aiayn.generate.translate import translate
from aiayn.interop.generation_config import NONE, GenerationIds
from aiayn.models import EncoderDecoder
from aiayn.serve.engine import QueueFull


class Translator:
    """Translation requests, each a batch of lines through beam search (or greedy), one batch
    at a time on a worker thread; at most ``max_queue`` wait."""

    def __init__(
        self,
        model: EncoderDecoder,
        tokenizer: BPETokenizer | MarianTokenizer,
        max_queue: int,
        generation: GenerationIds = NONE,
    ) -> None:
        self.model, self.tokenizer, self.max_queue = model, tokenizer, max_queue
        self.generation = generation  # the folder's decoder start / end / padding ids
        self.count, self.busy, self.waiting = threading.Lock(), threading.Lock(), 0
        self.stats = collections.Counter[str]()  # what /metrics reports

    async def __call__(self, lines: list[str], beam: int) -> list[str]:
        with self.count:
            if self.waiting > self.max_queue:
                self.stats["rejected"] += 1
                raise QueueFull(f"{self.waiting} translations are queued (max_queue)")
            self.waiting += 1
            self.stats["requests"] += 1
        try:
            config = None if beam == 1 else BeamConfig(beam_size=beam)
            out = await asyncio.to_thread(self._run, lines, config)
            with self.count:
                self.stats["lines"] += len(lines)
            return out
        except Exception:
            with self.count:
                self.stats["failed"] += 1
            raise
        finally:
            with self.count:
                self.waiting -= 1

    def _run(self, lines: list[str], config: BeamConfig | None) -> list[str]:
        with self.busy, torch.inference_mode():
            return translate(
                self.model, self.tokenizer, lines, beam=config, generation=self.generation
            )
