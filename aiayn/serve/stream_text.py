"""What a streaming request sends of its text: the text so far, decoding only the newest
tokens at each step (``incremental_text``), less the tail that could still become a stop
string (``held_back``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiayn.serve.engine import Request


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could be the start of a stop string: they are
    not sent until the next tokens show whether the stop string completes.  O(len(stop)) per
    stop string and call, whatever the length of ``text``."""
    keep = 0
    for s in stops:
        if len(s) > 1 and text:
            keep = max(keep, _prefix_at_end(s, text[-(len(s) - 1) :]))
    return keep


def _prefix_at_end(s: str, tail: str) -> int:
    """The length of the longest prefix of ``s`` that ``tail`` (shorter than ``s``) ends with:
    Knuth-Morris-Pratt's automaton for ``s`` run over ``tail``."""
    fail, k = _failure(s), 0
    for ch in tail:
        while k and s[k] != ch:
            k = fail[k - 1]
        if s[k] == ch:
            k += 1
    return k


@functools.lru_cache(maxsize=64)
def _failure(s: str) -> tuple[int, ...]:
    """KMP's failure function: for each i, the length of the longest proper prefix of
    ``s[: i + 1]`` that is also its suffix.  Made once per stop string."""
    fail, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return tuple(fail)


def incremental_text(r: Request, decode: Callable[[list[int]], str]) -> str:
    """The text of all of ``r.tokens``, decoding only the newest few at each call.

    Decoding the whole list at every token costs O(n) per token and O(n²) per request, for
    each of the running requests at every step.  Instead, as vLLM does, the tokens from ``decode_from`` (a
    character boundary) are decoded without and with the new ones, and the difference is the
    new text: it is right across a merge at the boundary and for a tokenizer that drops the
    first token's leading space.  While the newest tokens end inside a character (U+FFFD), the
    offsets stay put, so that the next token can complete it."""
    start, upto = r.decode_from, r.decoded_upto
    before, after = decode(r.tokens[start:upto]), decode(r.tokens[start:])
    if not after.startswith(before):  # the new tokens changed earlier text: decode it all
        text = decode(r.tokens)
        if not text.endswith("\ufffd"):  # the next call decodes from the start once more
            r.decoded, r.decode_from, r.decoded_upto = text, 0, len(r.tokens)
        return text
    new = after[len(before) :]
    if new.endswith("\ufffd"):
        return r.decoded + new
    r.decoded += new
    r.decode_from, r.decoded_upto = upto, len(r.tokens)
    return r.decoded
