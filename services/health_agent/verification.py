"""Verifying a recovery over a window. Pure: no clock, no I/O.

After the last step of a proposal ran, the window opens (``started_at``, length W):

- **completed** as soon as p95 has stayed at or under the threshold on every scrape for
  W seconds in a row, all of it after the window opened (reported p95: the highest seen
  in that run, the conservative figure);
- **failed** when a scrape at or after the end of the window (``started_at + W``) still
  breaches: the service did not recover in the time it was given. A breach *inside* the
  window only restarts the healthy run — the fix may take a moment to bite;
- an Alertmanager alert about the incident still firing keeps the healthy run from
  starting (an incident an error-rate alert opened is not over because its latency is
  fine); one still firing ``alert_grace`` after the window's end (Alertmanager reports a
  resolution only after its rule and group interval) makes the recovery **unverifiable**,
  not failed: a lost resolution must not compensate a fix that worked;
- **unverifiable** when neither happened by ``3W`` after the agent first looked at the
  window (``watched_from``; its start, unless a long tick delayed that look) — no
  samples of the service arrived, or gaps between them kept breaking the healthy run:
  nothing can be said, and a person must look (it is not *failed*: compensating a fix
  because the metrics are down could make things worse).

A gap between samples longer than ``max_gap`` restarts the healthy run: "stayed under"
must be observed, not assumed across missing scrapes. With regular samples a window is
decided by ``started_at + 2W`` plus one scrape; every window by 3W of the agent watching it.

``cadence`` is how long ago the agent last recorded a scrape of the estate. When the agent is
slow (a storm on a busy machine), every service's samples are that far apart: nothing
was missed, the agent looked less often. So a gap of one cadence is allowed too, up to
``W`` (no unobserved stretch longer than the window itself counts as "stayed under":
an agent frozen for a minute has not watched the service), and a window is not given
up before ``W`` plus three such cadences: a slow agent takes longer to collect a run.
When the agent recorded nothing at all for longer than that (it was killed or frozen, its
database or the metrics were down), the healthy run starts over, but that blind stretch moves
``watched_from`` on: 3W is the time the agent watched, so its own outage does not make a
recovery unverifiable. A gap in one service's samples while the agent looked at the rest
still counts.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from services.health_agent.detector import is_breaching


class Verdict(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    UNVERIFIABLE = "unverifiable"


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    p95_ms: float | None
    threshold_ms: float | None
    reason: str


@dataclass(frozen=True)
class Window:
    started_at: datetime
    length: timedelta
    run_started_at: datetime | None = None  # first sample of the current healthy run
    run_max_p95: float | None = None
    last_sample_at: datetime | None = None
    watched_from: datetime | None = None  # the agent's first look (see the module docstring)

    @property
    def ends_at(self) -> datetime:
        return self.started_at + self.length

    def gives_up_by(self, cadence: timedelta) -> datetime:
        """When the window is unverifiable, with the agent scraping every ``cadence``."""
        watched_from = self.watched_from or self.started_at
        return watched_from + max(3 * self.length, self.length + 3 * self.tolerated(cadence))

    def tolerated(self, cadence: timedelta) -> timedelta:
        """The part of the agent's cadence a healthy run may span unobserved."""
        return min(cadence, self.length)


def observe(
    window: Window,
    *,
    p95_ms: float,
    threshold_ms: float,
    at: datetime,
    max_gap: timedelta,
    cadence: timedelta = timedelta(0),
    firing_alert: str | None = None,
    alert_grace: timedelta = timedelta(0),
) -> tuple[Window, Outcome | None]:
    """Fold one sample into the window; an Outcome when the verification is decided.
    ``firing_alert``: the name of an alert about the incident that still fires."""
    if at < window.started_at:
        return window, None  # taken before the last step ran: says nothing about it
    window = _looked(window, at)
    if window.last_sample_at is not None and at <= window.last_sample_at:
        return window, None  # a replica's older scrape, folded after a newer one: already past it
    run_start, run_max = window.run_started_at, window.run_max_p95
    gap = timedelta(0) if window.last_sample_at is None else at - window.last_sample_at
    if gap > max(max_gap, window.tolerated(cadence)):
        run_start, run_max = None, None  # not observed in between: start over
        if cadence >= gap:
            # The agent looked at nothing in between (killed, frozen, its database gone):
            # its own blindness, not a gap in this service's samples. It does not count
            # against the recovery's time.
            window = replace(window, watched_from=(window.watched_from or window.started_at) + gap)
    window = replace(window, last_sample_at=at)
    breaching = is_breaching(p95_ms, threshold_ms)
    if breaching or firing_alert is not None:
        window = replace(window, run_started_at=None, run_max_p95=None)
        if breaching and at >= window.ends_at:
            reason = (
                f"p95 {p95_ms:.0f} ms is still above the {threshold_ms:.0f} ms threshold "
                f"{window.length.total_seconds():g} s after the recovery ran"
            )
            return window, Outcome(Verdict.FAILED, p95_ms, threshold_ms, reason)
        if firing_alert is not None and at >= window.ends_at + alert_grace:
            return window, _alert_outcome(window, firing_alert, alert_grace, p95_ms, threshold_ms)
        return window, None
    if run_start is None:
        run_start, run_max = at, p95_ms
    else:
        run_max = max(run_max or p95_ms, p95_ms)
    window = replace(window, run_started_at=run_start, run_max_p95=run_max)
    if at - run_start >= window.length:
        reason = f"p95 stayed at or under {threshold_ms:.0f} ms for {window.length.total_seconds():g} s"
        return window, Outcome(Verdict.COMPLETED, run_max, threshold_ms, reason)
    if at >= window.gives_up_by(cadence):
        reason = "gaps in the latency samples kept the healthy run shorter than the window"
        return window, Outcome(Verdict.UNVERIFIABLE, p95_ms, threshold_ms, reason)
    return window, None


def observe_nothing(
    window: Window,
    *,
    at: datetime,
    cadence: timedelta = timedelta(0),
    blind: timedelta = timedelta(0),
    firing_alert: str | None = None,
    alert_grace: timedelta = timedelta(0),
) -> tuple[Window, Outcome | None]:
    """No sample of the service this time; unverifiable once the window has run out.

    ``blind``: how long the agent itself saw nothing just before this look (its readings
    failed, or it was down), told once, on its first look after: that stretch does not
    count against the window, as in :func:`observe` (a restarted Prometheus has no rate
    for any service until its window holds new samples again). While an alert about the
    incident still fires the window is not given up before ``alert_grace`` past its end;
    then the alert decides: the recovery failed."""
    window = _looked(window, at)
    if blind > timedelta(0):
        window = replace(window, watched_from=(window.watched_from or window.started_at) + blind)
    deadline = window.gives_up_by(cadence)
    if firing_alert is not None:
        if at >= window.ends_at + alert_grace:
            return window, _alert_outcome(window, firing_alert, alert_grace, None, None)
        return window, None
    if at >= deadline:
        seen = "no" if window.last_sample_at is None else "too few"
        waited = (deadline - window.started_at).total_seconds()
        reason = f"{seen} latency samples of the service within {waited:g} s of the recovery"
        return window, Outcome(Verdict.UNVERIFIABLE, None, None, reason)
    return window, None


def _alert_outcome(
    window: Window, alert: str, grace: timedelta, p95_ms: float | None, threshold_ms: float | None
) -> Outcome:
    """An alert still firing past its grace: unverifiable, not failed. The agent did not
    measure a failure, and a resolution Alertmanager could not deliver looks the same as
    one that never happened; a person decides rather than a compensation undoing a fix."""
    waited = (window.length + grace).total_seconds()
    reason = f"alert {alert} about the incident is still firing {waited:g} s after the recovery ran"
    return Outcome(Verdict.UNVERIFIABLE, p95_ms, threshold_ms, reason)


def _looked(window: Window, at: datetime) -> Window:
    """The window with the agent's first look at it recorded (kept once set)."""
    if window.watched_from is not None:
        return window
    return replace(window, watched_from=max(at, window.started_at))
