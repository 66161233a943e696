"""The chaos monkey: SIGKILL one member every few seconds, and let supervisord restart it.

Components are taken in shuffled rounds, so every one of them is killed as often as the
others (a purely random pick can miss PostgreSQL in a short run). A service with
replicas is one component; which replica dies is random. The next interval starts once
the killed member runs again: the monkey kills members, it does not keep them down.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from tests.chaos.members import Target, pick, targets

log = logging.getLogger("chaos.monkey")


@dataclass
class Kills:
    by_component: Counter[str] = field(default_factory=Counter)
    restart_seconds: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.by_component.values())

    def report(self) -> dict[str, object]:
        return {
            "total": self.total,
            "byComponent": dict(sorted(self.by_component.items())),
            "restartSeconds": {c: max(s) for c, s in sorted(self.restart_seconds.items())},
            "failures": self.failures,
        }


class Monkey(threading.Thread):
    def __init__(self, every: float, replicas: dict[str, int], rng: random.Random) -> None:
        super().__init__(name="chaos-monkey", daemon=True)
        self.every = every
        self.replicas = replicas
        self.rng = rng
        self.kills = Kills()
        self.stop = threading.Event()
        self.paused = threading.Event()  # set: no kills (while an executor is frozen)

    def rounds(self) -> list[Target]:
        order = targets()
        self.rng.shuffle(order)
        return order

    def run(self) -> None:
        queue: list[Target] = []
        while not self.stop.wait(self.every):
            if self.paused.is_set():
                continue
            if not queue:
                queue = self.rounds()
            target = pick(queue.pop(0), self.replicas, self.rng)
            try:
                self.kill(target)
            except Exception as exc:
                self.kills.failures.append(f"{target.program}: {exc}"[:300])
                log.warning("monkey: %s", exc)

    def kill(self, target: Target) -> None:
        started = time.monotonic()
        pid = target.signal(signal.SIGKILL)
        target.wait_running(after=pid)
        self.kills.by_component[target.component] += 1
        self.kills.restart_seconds.setdefault(target.component, []).append(round(time.monotonic() - started, 1))
        log.info("killed %s (pid %d); running again after %.1fs", target.program, pid, time.monotonic() - started)
