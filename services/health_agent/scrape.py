"""The health agent's periodic task: read latency, detect breaches, decide verifications.

Each tick reads every watched service's latency once (:mod:`.metrics_source`: Prometheus
by default), then

1. per watched service whose detector state the reading changes, in its own savepoint
   (up to 50 to a transaction): locks the service's detector row, applies the
   hysteresis (:mod:`.detector`) and, when a breach is confirmed, opens an incident
   (:mod:`.incidents`) — ``incident-<n>`` from a sequence, ServiceLatencyIncreased then
   DiagnosisRequested (caused by it) in the outbox, in the same savepoint as the incident
   row — or adopts the one an alert opened for the service meanwhile. A partial unique
   index allows one open incident per service, so a breach that goes on never opens a
   second one, whatever the process does. Routine samples — a healthy service that stays healthy (nearly all of an
   estate, every tick), a breach already open that goes on (every service of a storm) —
   only move counters and the last sample, all in one statement: a transaction each made
   a tick over 2,000 services, or 200 breaching at once, take longer than the
   verification's allowed gap between samples. The services that go the long way get
   one scrape interval of the tick (at least 1 s); the rest wait for the next tick (a
   storm of 1,000 opening at once held one tick for 30-35 s, and every verification
   window with it), which starts with the first one left over, so no service waits
   behind others that keep changing;
2. every open verification window, in one transaction (``FOR UPDATE SKIP LOCKED``):
   folds the new sample in (:mod:`.verification`), with any alert about the incident
   still firing (:mod:`.alerts`: a recovery is not complete while one is), and, once
   decided, writes the outcome
   and emits RecoveryCompleted, RecoveryFailed (stage VERIFICATION, compensation
   required) or — when nothing could be observed — IncidentEscalated. The outcome
   column is written in the same transaction as the record and is checked under the
   row lock, so each window emits exactly once. Should that transaction fail, the
   windows are taken one by one, each in its own.

One service's failure (say, a record its values make invalid) does not stop the others:
every unit has its own savepoint or transaction, and a failing one is logged and retried
next tick. A lost database fails the whole tick, which the next one redoes.
Several replicas may run this task: row locks serialize them, and a detector row scraped
less than half an interval ago is left alone, so scrapes are not double-counted.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import psycopg
from prometheus_client import Counter, Histogram
from psycopg.rows import dict_row

from flotilla import Envelope, Record, ServiceContext, escalation
from flotilla.records import RecoveryCompleted, RecoveryFailed, ServiceLatencyIncreased
from services.health_agent import alerts, incidents
from services.health_agent.detector import Change, DetectorState, Hysteresis, Phase, is_breaching, observe
from services.health_agent.metrics_source import MetricsSource, Sample, ScrapeError
from services.health_agent.reconcile import RuleStates
from services.health_agent.settings import HealthSettings
from services.health_agent.verification import Outcome, Verdict, Window, observe_nothing
from services.health_agent.verification import observe as observe_window

log = logging.getLogger(__name__)


VERIFICATIONS = Counter(
    "flotilla_health_verifications_total", "Recovery verifications decided, by verdict.", ["service", "verdict"]
)
SCRAPE_FAILURES = Counter(
    "flotilla_health_scrape_failures_total",
    "Readings of the metrics source (Prometheus, or the sim's /metrics) that failed or came back partial.",
)
DETECTIONS_DEFERRED = Counter(
    "flotilla_health_detections_deferred_total",
    "Samples whose detector change (a streak that starts or ends, an incident to open) was left to the next tick "
    "because the tick's detection time ran out.",
)
# Long-way detections committed together. A savepoint each keeps one service's failure
# from undoing the others; a few dozen keeps each commit's wait for the outbox short.
DETECTIONS_PER_TRANSACTION = 50

TICK_SECONDS = Histogram(
    "flotilla_health_tick_seconds",
    "One scrape tick: the scrape, detection and verification. Ticks longer than the allowed gap "
    "between samples (3 scrape intervals) keep recoveries from being verified.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 30),
)


_UPDATE_WINDOW = """
UPDATE verifications SET run_started_at = %(run_started_at)s, run_max_p95_ms = %(run_max_p95_ms)s,
    last_sample_at = %(last_sample_at)s, watched_from = %(watched_from)s, outcome = %(outcome)s,
    outcome_reason = %(reason)s, outcome_event_id = %(event_id)s, decided_at = %(decided_at)s
WHERE proposal_id = %(proposal)s
"""


def settled(conn: psycopg.Connection[Any], service: str) -> bool:
    """Whether ``service`` is healthy with no incident open and no recovery being verified
    (or was never scraped): a fault injected now starts a new, independent incident,
    and cannot fail the verification window of the last one. An incident still held by an
    alert whose resolution has not arrived yet counts as open (a breach now would join it)
    unless the fleet has finished it (a breach now would open a new one:
    :func:`incidents.open_incident_of`)."""
    row = conn.execute("SELECT phase, open_incident FROM detector_state WHERE service = %s", (service,)).fetchone()
    if row is not None and (str(row[0]).lower() != Phase.HEALTHY or row[1] is not None):
        return False
    held = conn.execute(
        "SELECT h.incident_id FROM health_incidents h LEFT JOIN incident_workflow w USING (incident_id) "
        "WHERE h.service = %s AND h.cleared_at IS NULL AND (w.status IS NULL OR w.status <> ALL(%s))",
        (service, [str(status) for status in incidents.FINISHED]),
    ).fetchone()
    if held is not None:
        return False
    verifying = conn.execute(
        "SELECT 1 FROM verifications WHERE service = %s AND outcome IS NULL LIMIT 1", (service,)
    ).fetchone()
    return verifying is None


def starting_at(samples: list[Sample], first: tuple[str, str] | None) -> list[Sample]:
    """``samples`` in key order, rotated to start at ``first`` (or the next key after it,
    should that service be gone or settled): a tick that runs out of time resumes where
    the last one stopped, instead of serving the same services first every tick."""
    ordered = sorted(samples, key=lambda s: s.key)
    if first is None:
        return ordered
    start = next((i for i, s in enumerate(ordered) if s.key >= first), 0)
    return ordered[start:] + ordered[:start]


class Scraper:
    """The periodic task (one instance per process; it keeps no state between ticks)."""

    __name__ = "health_scrape"

    def __init__(self, settings: HealthSettings, source: MetricsSource, rules: RuleStates | None = None) -> None:
        self._settings = settings
        self._source = source
        self._rules = rules  # where a lost alert resolution can be found out (None: nowhere)
        self._opens = "metrics" in settings.health_open_from
        self._alert_grace = timedelta(seconds=settings.health_alert_resolve_grace_seconds)
        self._rule = Hysteresis(settings.health_breach_scrapes, settings.health_clear_scrapes)
        self._interval = timedelta(seconds=settings.health_scrape_seconds)
        self._max_gap = max(3 * self._interval, timedelta(seconds=1))
        self._previous_tick: datetime | None = None
        self._detect_budget = max(settings.health_scrape_seconds, 1.0)  # seconds of a tick for the long way
        self._resume_from: tuple[str, str] | None = None  # the first sample the last tick left over
        self._failing: str | None = None  # why the last reading failed, while it does

    def not_ready(self) -> str | None:
        """Why the agent cannot see the estate now (readiness): its last reading failed."""
        return None if self._failing is None else f"metrics source {self._source.name}: {self._failing}"

    def __call__(self, ctx: ServiceContext) -> None:
        with TICK_SECONDS.time():
            self._tick(ctx)

    def _tick(self, ctx: ServiceContext) -> None:
        samples: list[Sample] | None
        try:
            samples = self._source.scrape()
        except ScrapeError as exc:
            SCRAPE_FAILURES.inc()
            if self._failing is None:
                log.warning("cannot read the metrics (nothing is opened or decided until it can): %s", exc)
            self._failing = str(exc)[:500]
            samples = None
        else:
            if self._failing is not None:
                log.info("the metrics can be read again")
            self._failing = None
        now = ctx.now()  # once read: a slow scrape must not make its samples look older than they are
        # How long ago this agent last recorded a scrape: a slow tick (a storm) spaces every
        # service's samples out alike, and an agent killed, frozen or cut off from its
        # database or the metrics saw nothing at all; neither is a gap in one service's samples.
        if self._previous_tick is None:
            self._previous_tick = self._last_recorded(ctx)
        cadence = timedelta(0) if self._previous_tick is None else max(now - self._previous_tick, timedelta(0))
        done = self._record_routine(ctx, samples, now) if samples else set()
        changing = starting_at([sample for sample in samples or () if sample.key not in done], self._resume_from)
        self._detect_in_turn(ctx, changing, now)
        by_key = {s.key: s for s in samples or ()}
        scraped = samples is not None
        if scraped and self._rules is not None:
            self._unit("reconcile alerts", partial(self._reconcile_alerts, ctx))
        if not self._verify_all(ctx, by_key, now, scraped, cadence):
            for proposal in self._open_windows(ctx):
                self._unit(f"verify {proposal}", partial(self._verify, ctx, proposal, by_key, now, scraped, cadence))
        if scraped:
            self._previous_tick = now  # a tick that failed, or saw no metrics, recorded nothing

    def _reconcile_alerts(self, ctx: ServiceContext) -> None:
        """Alerts that hold a recovery unverified but whose rule Prometheus says no longer
        fires: resolved, as Alertmanager would have said (:mod:`.reconcile`). Asked outside
        any transaction; each resolution re-checks the row under its update."""
        assert self._rules is not None
        with ctx.pool.connection() as conn:
            held = alerts.held_by_alerts(conn)
        resolved = [
            row for row, done in zip(held, self._rules.resolved([r["labels"] for r in held]), strict=True) if done
        ]
        if resolved:
            with ctx.pool.connection() as conn, conn.transaction():
                for row in resolved:
                    alerts.resolve_lost(ctx, conn, self._settings.incidents_topic, row)

    @staticmethod
    def _last_recorded(ctx: ServiceContext) -> datetime | None:
        """The last scrape any replica recorded (before a restart, this one too)."""
        with ctx.pool.connection() as conn:
            row = conn.execute("SELECT max(last_scraped_at) FROM detector_state").fetchone()
        return None if row is None else row[0]

    def _detect_in_turn(self, ctx: ServiceContext, changing: list[Sample], now: datetime) -> None:
        """The long way for ``changing``, for as long as the tick's detection time lasts
        (at least one: always progress), up to :data:`DETECTIONS_PER_TRANSACTION` in one
        transaction with a savepoint each: in a storm a commit per opening, and a Kafka
        transaction per commit downstream, were most of an opening's cost."""
        self._resume_from = None
        budget_ends = time.monotonic() + self._detect_budget
        for start in range(0, len(changing), DETECTIONS_PER_TRANSACTION):
            if start > 0 and time.monotonic() >= budget_ends:
                self._defer(changing[start:])
                return
            chunk = changing[start : start + DETECTIONS_PER_TRANSACTION]
            with ctx.pool.connection() as conn, conn.transaction():
                for n, sample in enumerate(chunk):
                    if start + n > 0 and time.monotonic() >= budget_ends:
                        self._defer(changing[start + n :])
                        return
                    detect = partial(self._detect, ctx, conn, sample, now)
                    self._unit(f"detect {sample.environment}/{sample.service}", detect)

    def _defer(self, rest: list[Sample]) -> None:
        DETECTIONS_DEFERRED.inc(len(rest))  # still in the scrape next tick, which starts with them
        self._resume_from = rest[0].key

    @staticmethod
    def _unit(what: str, run: Callable[[], None]) -> None:
        try:
            run()
        except psycopg.OperationalError:
            raise  # the database is gone: the whole tick fails and is retried
        except Exception:
            log.exception("%s failed; retried next tick", what)

    # ------------------------------------------------------------ detection

    def _record_routine(self, ctx: ServiceContext, samples: list[Sample], now: datetime) -> set[tuple[str, str]]:
        """Record, in two statements, the samples that change no more than counters: a
        healthy service that stays healthy (nearly all of an estate, every tick), and a
        breach already open that goes on (every service of a storm until its recovery).
        A transaction per service made a tick over 2,000 services, or 200 breaching at
        once, longer than the verification's allowed gap between samples.

        Returns the keys done with: those recorded, and those another replica counted
        less than half an interval ago (left alone, as :meth:`_detect` would). Every
        other sample (a streak that starts or ends, an unknown service) goes the long way.
        The state is read without a lock; each statement checks it again under its own."""
        cutoff = now - self._interval / 2
        with ctx.pool.connection() as conn:
            rows = conn.execute(
                "SELECT environment, service, phase, breach_streak, healthy_streak, last_scraped_at FROM detector_state"
            ).fetchall()
            state = {(str(r[0]), str(r[1])): r[2:] for r in rows}
            counted: set[tuple[str, str]] = set()
            routine: list[Sample] = []
            for sample in samples:
                row = state.get(sample.key)
                if row is None:
                    continue
                phase, breach_streak, healthy_streak, last = row
                breach = is_breaching(sample.p95_ms, sample.threshold_ms)
                if last is not None and last > cutoff:
                    counted.add(sample.key)
                elif healthy_streak == 0 and (
                    (phase == Phase.HEALTHY.value and breach_streak == 0 and not breach)
                    or (phase == Phase.BREACHING.value and breach)
                ):
                    routine.append(sample)
            return counted | self._record(conn, routine, now, cutoff)

    @staticmethod
    def _record(
        conn: psycopg.Connection[Any], samples: list[Sample], now: datetime, cutoff: datetime
    ) -> set[tuple[str, str]]:
        """One UPDATE for routine samples of one kind: ``breach_streak`` goes up by one on a
        breach that goes on, nothing else but the last sample changes."""
        if not samples:
            return set()
        rows = conn.execute(
            "UPDATE detector_state AS d "
            "SET breach_streak = d.breach_streak + (d.phase = %(breaching)s)::int, "
            "last_p95_ms = q.p95, threshold_ms = q.threshold, last_scraped_at = %(now)s "
            "FROM unnest(%(environments)s::text[], %(services)s::text[], %(p95)s::float8[], %(thresholds)s::float8[]) "
            "AS q(environment, service, p95, threshold) "
            "WHERE d.environment = q.environment AND d.service = q.service AND d.healthy_streak = 0 "
            "AND (d.last_scraped_at IS NULL OR d.last_scraped_at <= %(cutoff)s) "
            "AND CASE WHEN q.p95 > q.threshold THEN d.phase = %(breaching)s "
            "ELSE d.phase = %(healthy)s AND d.breach_streak = 0 END "
            "RETURNING d.environment, d.service",
            {
                "now": now,
                "cutoff": cutoff,
                "environments": [s.environment for s in samples],
                "services": [s.service for s in samples],
                "p95": [s.p95_ms for s in samples],
                "thresholds": [s.threshold_ms for s in samples],
                "breaching": Phase.BREACHING.value,
                "healthy": Phase.HEALTHY.value,
            },
        ).fetchall()
        return {(str(e), str(s)) for e, s in rows}

    def _detect(self, ctx: ServiceContext, conn: psycopg.Connection[Any], sample: Sample, now: datetime) -> None:
        """One sample the long way, in a savepoint of ``conn``'s transaction: a failure
        undoes this service's changes only."""
        with conn.transaction():
            row = incidents.lock_service(conn, sample.environment, sample.service)
            last = row["last_scraped_at"]
            if last is not None and now - last < self._interval / 2:
                return  # another replica just counted this scrape
            state = DetectorState(
                Phase(row["phase"]), row["breach_streak"], row["healthy_streak"], row["breach_started_at"]
            )
            state, change = observe(
                state, breaching=is_breaching(sample.p95_ms, sample.threshold_ms), at=now, rule=self._rule
            )
            incident = row["open_incident"]
            if change is Change.OPENED:
                # An alert may have opened the service's incident already: adopt it.
                incident = incidents.open_incident_of(conn, *sample.key)
                if incident is None and self._opens:
                    incident = self._open_incident(ctx, conn, sample, state, now)
            elif change is Change.CLEARED and incident is not None:
                incidents.clear(conn, incident, now, breaching=False)
                incident = None
            conn.execute(
                "UPDATE detector_state SET phase = %s, breach_streak = %s, healthy_streak = %s, "
                "breach_started_at = %s, open_incident = %s, last_p95_ms = %s, threshold_ms = %s, "
                "last_scraped_at = %s WHERE environment = %s AND service = %s",
                (
                    state.phase.value,
                    state.breach_streak,
                    state.healthy_streak,
                    state.breach_started_at,
                    incident,
                    sample.p95_ms,
                    sample.threshold_ms,
                    now,
                    *sample.key,
                ),
            )

    def _open_incident(
        self, ctx: ServiceContext, conn: psycopg.Connection[Any], sample: Sample, state: DetectorState, now: datetime
    ) -> str | None:
        started = state.breach_started_at or now
        window = max(1, math.ceil((now - started).total_seconds()))

        def breach(incident: str) -> Record:
            return ServiceLatencyIncreased(
                incident_id=incident,
                service=sample.service,
                environment=sample.environment,
                p95_latency_ms=sample.p95_ms,
                threshold_ms=sample.threshold_ms,
                window_seconds=window,
                observed_at=now,
            )

        opening = incidents.Opening(
            environment=sample.environment,
            service=sample.service,
            fact=breach,
            symptom=(
                f"p95 {sample.p95_ms:.0f} ms against a {sample.threshold_ms:.0f} ms threshold "
                f"for {window} s ({state.breach_streak} consecutive readings)"
            ),
            signal="latency",
            opened_by="metrics",
            p95_ms=sample.p95_ms,
            threshold_ms=sample.threshold_ms,
        )
        # None past the service's incident cap: the breach goes on with no incident to release
        opened = incidents.open_incident(ctx, conn, opening, now=now, topic=self._settings.incidents_topic)
        return None if opened is None else opened[0]

    # --------------------------------------------------------- verification

    @staticmethod
    def _open_windows(ctx: ServiceContext) -> list[str]:
        with ctx.pool.connection() as conn:
            rows = conn.execute(
                "SELECT proposal_id FROM verifications WHERE outcome IS NULL ORDER BY started_at"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def _verify_all(
        self,
        ctx: ServiceContext,
        samples: Mapping[tuple[str, str], Sample],
        now: datetime,
        scraped: bool,
        cadence: timedelta,
    ) -> bool:
        """Every open window not held by another replica, in one transaction (a storm keeps
        hundreds open at once). False when that failed for any reason but a lost database:
        the caller then goes window by window, so one bad window cannot hold up the rest."""
        try:
            with ctx.pool.connection() as conn, conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(
                    "SELECT * FROM verifications WHERE outcome IS NULL ORDER BY started_at FOR UPDATE SKIP LOCKED"
                ).fetchall()
                firing = incidents.firing_alerts(conn, {row["incident_id"] for row in rows})
                folded = [(row, self._fold(ctx, conn, row, samples, now, scraped, cadence, firing)) for row in rows]
                cur.executemany(_UPDATE_WINDOW, [update for _, (update, _) in folded])
        except psycopg.OperationalError:
            raise
        except Exception:
            log.exception("verifying the open windows together failed; going one by one")
            return False
        for row, (_, outcome) in folded:
            self._report(row, outcome)
        return True

    def _verify(
        self,
        ctx: ServiceContext,
        proposal: str,
        samples: Mapping[tuple[str, str], Sample],
        now: datetime,
        scraped: bool,
        cadence: timedelta,
    ) -> None:
        with ctx.pool.connection() as conn, conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                "SELECT * FROM verifications WHERE proposal_id = %s AND outcome IS NULL FOR UPDATE SKIP LOCKED",
                (proposal,),
            ).fetchone()
            if row is None:
                return  # decided meanwhile, or another replica holds it
            firing = incidents.firing_alerts(conn, [row["incident_id"]])
            update, outcome = self._fold(ctx, conn, row, samples, now, scraped, cadence, firing)
            cur.execute(_UPDATE_WINDOW, update)
        self._report(row, outcome)

    def _fold(
        self,
        ctx: ServiceContext,
        conn: psycopg.Connection[Any],
        row: Mapping[str, Any],
        samples: Mapping[tuple[str, str], Sample],
        now: datetime,
        scraped: bool,
        cadence: timedelta,
        firing: Mapping[str, str],
    ) -> tuple[dict[str, Any], Outcome | None]:
        """Fold this tick's sample into the locked window ``row``; emit its outcome once
        decided. Returns the row's update (for ``_UPDATE_WINDOW``) and the outcome;
        ``cadence``: how far apart this agent's ticks are now (see verification.py);
        ``firing``: incident -> an alert about it still firing."""
        window = Window(
            started_at=row["started_at"],
            length=timedelta(seconds=row["window_seconds"]),
            run_started_at=row["run_started_at"],
            run_max_p95=row["run_max_p95_ms"],
            last_sample_at=row["last_sample_at"],
            watched_from=row["watched_from"],
        )
        sample = samples.get((row["environment"], row["service"])) if scraped else None
        outcome: Outcome | None
        if sample is None:
            # The first reading after the agent saw nothing for longer than the allowed gap:
            # that blind stretch is the agent's, not this service's (observe() does the same
            # for a window whose service has a sample now).
            blind = cadence if scraped and cadence > self._max_gap else timedelta(0)
            window, outcome = observe_nothing(
                window,
                at=now,
                cadence=cadence,
                blind=blind,
                firing_alert=firing.get(row["incident_id"]),
                alert_grace=self._alert_grace,
            )
        else:
            window, outcome = observe_window(
                window,
                p95_ms=sample.p95_ms,
                threshold_ms=sample.threshold_ms,
                at=now,
                max_gap=self._max_gap,
                cadence=cadence,
                firing_alert=firing.get(row["incident_id"]),
                alert_grace=self._alert_grace,
            )
        event_id = None if outcome is None else self._emit_outcome(ctx, conn, row, window, outcome, now)
        update = {
            "proposal": row["proposal_id"],
            "run_started_at": window.run_started_at,
            "run_max_p95_ms": window.run_max_p95,
            "last_sample_at": window.last_sample_at,
            "watched_from": window.watched_from,
            "outcome": None if outcome is None else outcome.verdict.value,
            "reason": None if outcome is None else outcome.reason,
            "event_id": event_id,
            "decided_at": None if outcome is None else now,
        }
        return update, outcome

    @staticmethod
    def _report(row: Mapping[str, Any], outcome: Outcome | None) -> None:
        if outcome is not None:
            VERIFICATIONS.labels(row["service"], outcome.verdict.value).inc()
            log.info(
                "%s: verification of proposal %s %s: %s",
                row["incident_id"],
                row["proposal_id"],
                outcome.verdict,
                outcome.reason,
            )

    def _emit_outcome(
        self,
        ctx: ServiceContext,
        conn: psycopg.Connection[Any],
        row: Mapping[str, Any],
        window: Window,
        outcome: Outcome,
        now: datetime,
    ) -> str:
        incident = row["incident_id"]
        cause = Envelope(**row["cause"])  # the last RecoveryExecuted of the plan
        seconds = max(1, math.ceil(window.length.total_seconds()))
        topic = self._settings.incidents_topic
        record: Record
        if outcome.verdict is Verdict.COMPLETED:
            assert outcome.p95_ms is not None and outcome.threshold_ms is not None  # a completed window measured
            record = RecoveryCompleted(
                incident_id=incident,
                proposal_id=str(row["proposal_id"]),
                service=row["service"],
                p95_latency_ms=outcome.p95_ms,
                threshold_ms=outcome.threshold_ms,
                window_seconds=seconds,
                completed_at=now,
            )
        elif outcome.verdict is Verdict.FAILED:
            record = RecoveryFailed(
                incident_id=incident,
                proposal_id=str(row["proposal_id"]),
                stage="VERIFICATION",
                reason=outcome.reason,
                p95_latency_ms=outcome.p95_ms,
                compensation_required=True,
                failed_at=now,
            )
        else:
            record = escalation(incident, f"recovery could not be verified: {outcome.reason}", cause=cause, at=now)
        envelope = ctx.emit(conn, record, key=incident, correlation=incident, cause=cause, topic=topic)
        return envelope.id
