"""The incidents of a chaos run, and the person who approves the ones that need one.

Each incident is one pair of the generated estate: ``pay-NNNN`` turns slow, so
``shop-NNNN`` breaches and the health agent opens an incident. A quarter of the pairs
are in production, where the policy service waits for a person (:class:`Approver`).
A share of the pairs is forced to fail verification: once the scale has been applied at
the sim, ``shop-NNNN`` gets a bad deploy that no scaling fixes, so the health agent reports
RecoveryFailed and the executor compensates; the pair's faults are then removed, so
whatever incident the lingering breach reopens can resolve.

The sim keeps its faults in its ledger file, so a killed sim comes back as broken as it
was. The workload still reconciles: a pair whose incident has not opened yet and whose
fault the sim does not list gets it again (counted as ``reinjected``; expected 0, kept
because a sim started without its file would forget). What counts as an incident is
what the health agent opened (its database), never what the workload meant to cause.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

from flotilla.fleet import AUDIT, HEALTH, POLICY, SIM, url
from flotilla.settings import StackSettings
from tests.chaos import db
from tests.chaos.config import APPROVER_TOKEN, ChaosConfig
from tests.chaos.http import call
from tests.e2e.fleet import HttpError

log = logging.getLogger("chaos.workload")


@dataclass
class Pair:
    index: str  # NNNN
    environment: str
    replicas: int  # shop-NNNN's replicas before any action
    forced_failure: bool
    injected: bool = False
    incident: str | None = None  # the first incident the health agent opened for shop-NNNN
    bad_deploy: bool = False
    cleared: bool = False  # a forced pair's faults removed after its failure
    # the fault is on but shop-NNNN stays under its threshold: it was already scaled when
    # the run began (a command of an earlier run, carried out late), so nothing breaches
    no_breach: bool = False

    @property
    def done(self) -> bool:
        return self.incident is not None or self.no_breach

    @property
    def shop(self) -> str:
        return f"shop-{self.index}"

    @property
    def pay(self) -> str:
        return f"pay-{self.index}"


@dataclass
class Tally:
    injected: int = 0
    reinjected: int = 0  # faults the sim no longer listed, raised again
    bad_deploys: int = 0
    approvals: int = 0
    approval_refusals: int = 0
    not_ours: int = 0  # pending proposals of incidents the run did not open, left alone
    errors: list[str] = field(default_factory=list)


def estate(config: ChaosConfig, rng: random.Random) -> list[Pair]:
    """The pairs of the generated estate the run breaks, in a shuffled order."""
    described = call("GET", f"{url(SIM)}/services")
    shops = sorted((s for s in described if s["name"].startswith("shop-")), key=lambda s: s["name"])
    chosen = rng.sample(shops, min(config.incidents, len(shops)))
    forced = set(rng.sample(range(len(chosen)), round(config.failure_share * len(chosen))))
    return [
        Pair(s["name"].split("-", 1)[1], s["environment"], s["replicas"], forced_failure=i in forced)
        for i, s in enumerate(chosen)
    ]


class Workload(threading.Thread):
    """Injects the faults at the configured rate, then keeps reconciling until stopped."""

    def __init__(self, config: ChaosConfig, stack: StackSettings, pairs: list[Pair], started: datetime) -> None:
        super().__init__(name="chaos-workload", daemon=True)
        self.config = config
        self.stack = stack
        self.pairs = pairs
        self.started = started
        self.tally = Tally()
        self.stop = threading.Event()
        # Every incident the health agent opened since the run started (reopened ones too):
        # the only ones the run's approver may decide on.
        self.incidents: frozenset[str] = frozenset()

    def run(self) -> None:
        next_injection = time.monotonic()
        pending = list(self.pairs)
        while not self.stop.is_set():
            try:
                while pending and time.monotonic() >= next_injection:
                    pair = pending[0]
                    self._fault(pair.pay, "dependency-slow")  # raises while the sim is down: tried again
                    pending.pop(0)
                    pair.injected = True
                    self.tally.injected += 1
                    next_injection += 1 / self.config.inject_per_second
                self._reconcile()
            except Exception as exc:  # a member down longer than the patience: try again
                self.tally.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                log.warning("workload: %s", exc)
            self.stop.wait(1.0)

    @property
    def all_injected(self) -> bool:
        return all(p.injected for p in self.pairs)

    def _fault(self, service: str, kind: str) -> None:
        call("POST", f"{url(SIM)}/faults", {"service": service, "kind": kind})

    def _reconcile(self) -> None:
        rows = db.rows(
            self.stack.pg_dsn(HEALTH.database),
            "SELECT incident_id, service FROM health_incidents WHERE opened_at >= %s ORDER BY opened_at DESC",
            (self.started,),
        )
        self.incidents = frozenset(str(incident) for incident, _ in rows)
        opened = {service: incident for incident, service in rows}
        for pair in self.pairs:
            if pair.injected and pair.incident is None:
                pair.incident = opened.get(pair.shop)
        active = {(f["service"], f["kind"]) for f in call("GET", f"{url(SIM)}/faults")}
        for pair in self.pairs:
            if not pair.injected or pair.done:
                continue
            if (pair.pay, "dependency-slow") not in active:
                self._fault(pair.pay, "dependency-slow")  # the sim lost it (started without its file)
                self.tally.reinjected += 1
            else:
                shop = call("GET", f"{url(SIM)}/services/{pair.shop}")
                pair.no_breach = shop["p95Ms"] <= shop["thresholdMs"] and shop["replicas"] > pair.replicas
        self._force_failures()

    def _force_failures(self) -> None:
        forced = [p for p in self.pairs if p.forced_failure and p.incident is not None and not p.cleared]
        statuses = dict(
            db.rows(
                self.stack.pg_dsn(AUDIT.database),
                "SELECT incident_id, status FROM audit_incidents WHERE incident_id = ANY(%s)",
                ([p.incident for p in forced],),
            )
        )
        for pair in forced:
            status = statuses.get(pair.incident)
            if status in ("FAILED", "COMPENSATED", "RESOLVED", "ESCALATED"):
                self._clear(pair)
            elif not pair.bad_deploy and call("GET", f"{url(SIM)}/services/{pair.shop}")["replicas"] > pair.replicas:
                self._fault(pair.shop, "bad-deploy")  # scaled: now verification must fail
                pair.bad_deploy = True
                self.tally.bad_deploys += 1

    def _clear(self, pair: Pair) -> None:
        for fault in call("GET", f"{url(SIM)}/faults"):
            if fault["service"] in (pair.shop, pair.pay):
                try:
                    call("DELETE", f"{url(SIM)}/faults/{fault['id']}")
                except HttpError as exc:
                    if exc.status != 404:
                        raise
        pair.cleared = True


class Approver(threading.Thread):
    """A person with the approver role who approves every pending proposal of the run's
    own incidents, exactly as shown (by its digest), through the policy service's API.

    A proposal of any other incident is left alone, as an on-call engineer leaves what
    belongs to an incident they were not called for: the stack may carry a proposal
    that a demo or the e2e suite left waiting (issue 31)."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(name="chaos-approver", daemon=True)
        self.workload = workload
        self.tally = workload.tally
        self.stop = threading.Event()
        self._passed_over: set[str] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for pending in call("GET", f"{url(POLICY)}/approvals?status=pending", token=APPROVER_TOKEN):
                    if pending["incidentId"] in self.workload.incidents:
                        self._approve(pending)
                    elif pending["proposalId"] not in self._passed_over:
                        self._passed_over.add(pending["proposalId"])
                        self.tally.not_ours += 1
                        log.info("left alone: proposal %s of %s", pending["proposalId"], pending["incidentId"])
            except Exception as exc:
                self.tally.errors.append(f"approver: {type(exc).__name__}: {exc}"[:300])
            self.stop.wait(1.0)

    def _approve(self, pending: dict[str, object]) -> None:
        address = f"{url(POLICY)}/approvals/{pending['proposalId']}/approve"
        try:
            call("POST", address, {"digest": pending["digest"]}, token=APPROVER_TOKEN)
            self.tally.approvals += 1
        except HttpError as exc:
            # decided meanwhile (a retry after a lost answer, a superseded proposal): the
            # policy service says so and nothing changes
            self.tally.approval_refusals += 1
            log.info("approval of %s refused: %s", pending["proposalId"], exc)
