"""Stopping a decode from another thread: a server's client that leaves cancels its job, and
the decoding loop stops at its next step instead of running to its length limit.

The loops of aiayn/generate/ (greedy, beam search, batched embedding) take an optional
``CancelToken`` and call ``CancelToken.check`` once per step (or batch); whoever
holds the token calls ``CancelToken.cancel`` from any thread.
"""

from __future__ import annotations

import threading


class Cancelled(Exception):
    """Raised inside a decoding loop whose token was cancelled: its result is not wanted."""


class CancelToken:
    """A flag one thread sets and a decoding loop reads once per step."""

    def __init__(self) -> None:
        self._set = threading.Event()

    def cancel(self) -> None:
        self._set.set()

    @property
    def cancelled(self) -> bool:
        return self._set.is_set()

    def check(self) -> None:
        """Raise ``Cancelled`` once ``cancel`` has been called."""
        if self._set.is_set():
            raise Cancelled("the decode was cancelled")


def check(token: CancelToken | None) -> None:
    """``CancelToken.check`` for a loop whose token is optional."""
    if token is not None:
        token.check()
