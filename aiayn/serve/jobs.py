"""One job at a time on a worker thread, a bounded queue before it, and a job that stops
when its client leaves: what the translation and embedding endpoints share.

A request's job runs on a thread (the event loop stays free), behind a lock, so one runs and
the others wait.  At most ``max_queue`` wait: with one running, the next beyond that is a 429.
While a job runs or waits, the server looks every quarter second whether its client is still
there; a client gone cancels the job's ``CancelToken``, and the
decoding loop stops at its next step (or, still waiting, never starts).  The queue counts a job
until its thread has stopped, so a cancelled job is not replaced before it has let go.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable
from typing import TypeVar

from fastapi import Request

from aiayn.generate.cancel import CancelToken
from aiayn.serve.engine import QueueFull
from aiayn.serve.errors import APIError

T = TypeVar("T")

POLL_SECONDS = 0.25  # how often a waiting request looks whether its client has gone


class JobQueue:
    """Jobs of one kind (``what``: "translations"), one running at a time, ``max_queue``
    more waiting.  ``stats`` counts requests, refused, failed and cancelled ones."""

    def __init__(self, max_queue: int, what: str) -> None:
        self.max_queue, self.what = max_queue, what
        self.in_flight = 0  # running + waiting, each counted until its thread stops
        self._count, self._busy = threading.Lock(), threading.Lock()
        self.stats = collections.Counter[str]()

    def _admit(self) -> None:
        with self._count:
            if self.in_flight > self.max_queue:  # one runs, max_queue wait: this would be one more
                self.stats["rejected"] += 1
                queued = self.in_flight - 1
                raise QueueFull(f"{queued} {self.what} are queued (max_queue={self.max_queue})")
            self.in_flight += 1
            self.stats["requests"] += 1

    def _release(self, _: object = None) -> None:
        with self._count:
            self.in_flight -= 1

    def _locked(self, job: Callable[[CancelToken], T], token: CancelToken) -> T:
        with self._busy:
            token.check()  # its client left while it waited: never start it
            return job(token)

    async def run(self, job: Callable[[CancelToken], T], http: Request | None) -> T:
        """``job(token)`` on a worker thread, once the jobs before it are done.  A client gone
        meanwhile cancels it and gets a 499; a job's own error is counted and raised."""
        self._admit()
        token = CancelToken()
        future = asyncio.ensure_future(asyncio.to_thread(self._locked, job, token))
        future.add_done_callback(self._release)
        try:
            return await self._until_done(future, token, http)
        except asyncio.CancelledError:
            token.cancel()
            raise
        except APIError:
            raise
        except Exception:
            with self._count:
                self.stats["failed"] += 1
            raise

    async def _until_done(
        self, future: asyncio.Future[T], token: CancelToken, http: Request | None
    ) -> T:
        while True:
            done, _ = await asyncio.wait({future}, timeout=POLL_SECONDS)
            if done:
                return future.result()
            if http is not None and await http.is_disconnected():
                token.cancel()
                with self._count:
                    self.stats["cancelled"] += 1
                raise APIError(499, "client closed the request")
