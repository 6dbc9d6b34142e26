"""Generated tokens as text, while they come: whole characters only.

A byte-level BPE token may end inside a UTF-8 character (its text then ends in U+FFFD): that
text is held back until the tokens completing the character arrive.  The new text is the
difference between decoding the window without and with the new tokens, the window starting
at the previous piece written (at first, the prompt), so that a tokenizer which drops a
leading space of the first token decoded keeps the space between words.
"""

from __future__ import annotations

from collections.abc import Callable


class TextStream:
    """The text that each new token completes (module docstring)."""

    def __init__(self, decode: Callable[[list[int]], str], prompt_ids: list[int]) -> None:
        self.decode = decode
        self.ids = list(prompt_ids)
        self.start, self.upto = 0, len(self.ids)  # the window's start; written up to here

    def add(self, token: int) -> str:
        """The text that ``token`` completes ("" while a character is unfinished)."""
        self.ids.append(token)
        after = self.decode(self.ids[self.start :])
        if after.endswith("\ufffd"):
            return ""
        new = after[len(self.decode(self.ids[self.start : self.upto])) :]
        self.start, self.upto = self.upto, len(self.ids)
        return new

    def rest(self) -> str:
        """What is still held back when generation ends (an unfinished character)."""
        if self.upto == len(self.ids):
            return ""
        after = self.decode(self.ids[self.start :])
        return after[len(self.decode(self.ids[self.start : self.upto])) :]
