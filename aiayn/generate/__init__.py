"""Decoding: sampling for language models (and, with translation, beam search)."""

from aiayn.generate.lm import generate, stream
from aiayn.generate.sampling import SamplingConfig, choose_next

__all__ = ["SamplingConfig", "choose_next", "generate", "stream"]
