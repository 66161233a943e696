"""Breach detection with hysteresis, per watched service. Pure: no clock, no I/O.

A service is *breaching* when its p95 latency is above its threshold. One slow scrape
must not page anyone, and one fast scrape in the middle of an outage must not close and
reopen the incident, so the detector has two phases:

- ``healthy``: K consecutive breaching scrapes move it to ``breaching`` and open an
  incident (:attr:`Change.OPENED`); a healthy scrape resets the count.
- ``breaching``: M consecutive healthy scrapes move it back to ``healthy``
  (:attr:`Change.CLEARED`); a breaching scrape resets that count. While breaching,
  nothing else is opened, however long the breach lasts: one incident per breach.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime


class Phase(enum.StrEnum):
    HEALTHY = "healthy"
    BREACHING = "breaching"


class Change(enum.StrEnum):
    NONE = "none"
    OPENED = "opened"  # a breach was confirmed: open an incident
    CLEARED = "cleared"  # the breach is over


@dataclass(frozen=True)
class Hysteresis:
    open_after: int  # K consecutive breaching scrapes
    clear_after: int  # M consecutive healthy scrapes

    def __post_init__(self) -> None:
        if self.open_after < 1 or self.clear_after < 1:
            raise ValueError("hysteresis counts must be at least 1")


@dataclass(frozen=True)
class DetectorState:
    phase: Phase = Phase.HEALTHY
    breach_streak: int = 0
    healthy_streak: int = 0
    breach_started_at: datetime | None = None  # first scrape of the current breaching run


def is_breaching(p95_ms: float, threshold_ms: float) -> bool:
    return p95_ms > threshold_ms


def observe(state: DetectorState, *, breaching: bool, at: datetime, rule: Hysteresis) -> tuple[DetectorState, Change]:
    """The state after one scrape, and whether it opened or cleared a breach."""
    if state.phase is Phase.HEALTHY:
        if not breaching:
            return DetectorState(), Change.NONE
        streak = state.breach_streak + 1
        started = state.breach_started_at or at
        if streak >= rule.open_after:
            return DetectorState(Phase.BREACHING, streak, 0, started), Change.OPENED
        return DetectorState(Phase.HEALTHY, streak, 0, started), Change.NONE
    if breaching:
        return replace(state, breach_streak=state.breach_streak + 1, healthy_streak=0), Change.NONE
    healthy = state.healthy_streak + 1
    if healthy >= rule.clear_after:
        return DetectorState(), Change.CLEARED
    return replace(state, healthy_streak=healthy), Change.NONE
