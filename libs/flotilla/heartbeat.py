"""Keep a lease alive while slow work runs, so the lease itself can be short.

A lease nobody renews must outlast the slowest call it covers (a model answering after a
minute, twice), and then a worker killed mid-call leaves its work untouched for that long:
in the chaos soak, four incidents waited the remediation agent's 7-minute lease out after
a kill. With a heartbeat the lease only has to outlast a missed beat or two: a live worker
renews it every ``every`` seconds, a dead one stops, and its work is taken again soon.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

__all__ = ["Heartbeat"]

log = logging.getLogger(__name__)


class Heartbeat:
    """Calls ``renew`` every ``every`` seconds on its own thread while the ``with`` block runs.

    ``renew`` returns False when the lease is no longer ours (taken over, finished): the
    beats stop and :attr:`lost` is set; the work's own finish step still checks ownership,
    so a lost lease only means its result will be dropped. A ``renew`` that raises (the
    database restarting) is logged and tried again at the next beat.
    """

    def __init__(self, renew: Callable[[], bool], every: float, what: str) -> None:
        if every <= 0:
            raise ValueError(f"a heartbeat needs a positive period, not {every}")
        self._renew = renew
        self._every = every
        self._what = what
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0
        self.lost = threading.Event()

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self._what}", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._every):
            try:
                held = self._renew()
            except Exception as exc:  # the lease may still be ours: try again next beat
                log.warning("%s: renewing the lease failed (%s)", self._what, exc)
                continue
            if not held:
                log.warning("%s: the lease is no longer ours; its result will be dropped", self._what)
                self.lost.set()
                return
            self.beats += 1
