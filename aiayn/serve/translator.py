"""The worker behind ``POST /v1/translate``: an encoder-decoder's translation requests, each
a batch of lines through beam search (or greedy), one batch at a time on a worker thread
(aiayn/serve/jobs.py: a bounded queue, and a job that stops when its client leaves)."""

from __future__ import annotations

import torch
from fastapi import Request

from aiayn.data.tokenizer import BPETokenizer, MarianTokenizer
from aiayn.generate.beam import BeamConfig
from aiayn.generate.cancel import CancelToken
from aiayn.generate.translate import translate
from aiayn.interop.generation_config import NONE, GenerationIds
from aiayn.models import EncoderDecoder
from aiayn.serve.jobs import JobQueue


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
        self.model, self.tokenizer = model, tokenizer
        self.generation = generation  # the folder's decoder start / end / padding ids
        self.jobs = JobQueue(max_queue, "translations")
        self.stats = self.jobs.stats  # what /metrics reports

    @property
    def waiting(self) -> int:
        return self.jobs.in_flight  # the one running and those queued (/metrics)

    async def __call__(self, lines: list[str], beam: int, http: Request | None = None) -> list[str]:
        """The translations of ``lines``; a client that leaves (``http``) stops them."""
        config = None if beam == 1 else BeamConfig(beam_size=beam)
        out = await self.jobs.run(lambda token: self._run(lines, config, token), http)
        self.stats["lines"] += len(lines)
        return out

    def _run(self, lines: list[str], config: BeamConfig | None, token: CancelToken) -> list[str]:
        with torch.inference_mode():
            return translate(
                self.model,
                self.tokenizer,
                lines,
                beam=config,
                generation=self.generation,
                cancel=token,
            )
