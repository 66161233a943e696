"""One expensive check for many callers, and never a stale answer.

``GET /verify`` walks the whole chain and checks every signature, and anyone may call it:
unshared, each call is a full walk, so a few callers in a loop keep the audit's CPU busy.
:class:`SharedRun` lets concurrent callers share walks without ever answering from a walk
that started before the caller asked: a caller gets the result of the first run that
*starts* after it arrived (a run already under way when it arrives may have missed a
change made just before, so it waits for the next one, which every caller arriving
meanwhile shares). At most one run is under way at a time, a new one starts no sooner
than the last one took after it ended (so the check takes at most about half of one
core, however many call), and callers beyond a bound are turned away (:class:`Busy`)
instead of tying up the server's threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Busy(Exception):
    """Too many callers are already waiting for the check."""


class SharedRun(Generic[T]):
    def __init__(
        self,
        run: Callable[[], T],
        *,
        max_callers: int = 8,
        rest_ratio: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``rest_ratio``: how long to pause between runs, as a share of the last run's time."""
        if max_callers < 1:
            raise ValueError("max_callers must be at least 1")
        self._run = run
        self._max_callers = max_callers
        self._rest_ratio = rest_ratio
        self._clock = clock
        self._cond = threading.Condition()
        self._callers = 0
        self._running = False
        self._started = 0  # runs started so far; a run's number is its generation
        self._finished = 0  # the generation of the last run that finished
        self._outcome: tuple[T | None, BaseException | None] = (None, None)
        self._not_before = 0.0  # when the next run may start

    def __call__(self) -> T:
        with self._cond:
            if self._callers >= self._max_callers:
                raise Busy(f"{self._callers} callers are already waiting for this check")
            self._callers += 1
        try:
            return _unwrap(self._share())
        finally:
            with self._cond:
                self._callers -= 1

    def _share(self) -> tuple[T | None, BaseException | None]:
        """The outcome of the first run to start after this call: run by this caller if no
        other caller has started it yet."""
        with self._cond:
            wanted = self._started + 1
            while self._finished < wanted:
                if self._running:  # a run that may have started before this call: not ours
                    self._cond.wait()
                    continue
                pause = self._not_before - self._clock()
                if pause > 0:
                    self._cond.wait(pause)
                    continue
                self._running = True
                self._started += 1
                break
            else:
                return self._outcome
        return self._lead()

    def _lead(self) -> tuple[T | None, BaseException | None]:
        """Run the check for every caller waiting for this generation, and publish its outcome."""
        began = self._clock()
        outcome: tuple[T | None, BaseException | None]
        try:
            outcome = (self._run(), None)
        except BaseException as exc:  # handed to every caller of this run
            outcome = (None, exc)
        ended = self._clock()
        with self._cond:
            self._running = False
            self._finished = self._started
            self._outcome = outcome
            self._not_before = ended + (ended - began) * self._rest_ratio
            self._cond.notify_all()
        return outcome


def _unwrap(outcome: tuple[T | None, BaseException | None]) -> T:
    value, error = outcome
    if error is not None:
        raise error
    return value  # type: ignore[return-value]  # a run that did not raise returned a T
