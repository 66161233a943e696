"""The chaos soak: incidents under random SIGKILLs, a frozen executor, then a full re-read.

1. Incidents run (config.py: how many, how fast; a share in production, approved by a
   scripted person; a share forced to fail verification and compensate), poison records
   are published among them, and a monkey SIGKILLs a member every few seconds — every
   service, the sim, Kafka, Connect, the registry and PostgreSQL, in shuffled rounds —
   while supervisord restarts each. Halfway, one executor replica is frozen (SIGSTOP)
   past its lease and its Kafka session, then resumed.
2. After the last kill the incidents drain; then every invariant is checked against
   ground truth (ground_truth.py).
3. The duplicate-delivery pass (rewind.py): every consumer group re-reads everything.

The report (figures per invariant, kills per component) is printed and written to
.stack/chaos/report.json. ``make chaos`` runs the long soak; ``make test`` a short one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flotilla import stackcheck
from flotilla.fleet import EXECUTOR, SIM, url
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings
from tests.chaos import ground_truth as truth
from tests.chaos import poison, rewind
from tests.chaos.config import REPO_ROOT, ChaosConfig
from tests.chaos.conftest import LEDGER, executor_token, fleetctl
from tests.chaos.http import call
from tests.chaos.members import Target, targets
from tests.chaos.monkey import Monkey
from tests.chaos.workload import Approver, Workload, estate

pytestmark = pytest.mark.timeout(int(os.environ.get("CHAOS_TIMEOUT_SECONDS", "2400")))

log = logging.getLogger("chaos")
REPORT = REPO_ROOT / ".stack" / "chaos" / "report.json"
# An outbox hop takes milliseconds on a settled stack, but the first Kafka transaction of a
# Connect task restarted by the last kill can stay open for tens of seconds (its producer
# fences the old one and reads the offsets topic first), and a read_committed reader does
# not see its rows until it commits: a row still missing is looked for again for this long.
OUTBOX_PATIENCE_SECONDS = 90.0
FREEZE_SECONDS = 30.0  # past the executor's lease (6 s here) and its Kafka session (10 s)


def wait_stack_healthy(stack: StackSettings, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while problems := stackcheck.problems(stack):
        if time.monotonic() > deadline:
            raise AssertionError(f"the stack did not recover: {problems}")
        time.sleep(1)


def freeze_an_executor(monkey: Monkey, rng: random.Random) -> dict[str, Any]:
    """SIGSTOP one executor replica for FREEZE_SECONDS while incidents keep coming."""
    monkey.paused.set()
    try:
        frozen = Target("fleet", rng.choice([EXECUTOR.name, f"{EXECUTOR.name}-1"]))
        pid = frozen.signal(signal.SIGSTOP)
        try:
            time.sleep(FREEZE_SECONDS)
        finally:
            os.kill(pid, signal.SIGCONT)
        return {"executor": frozen.program, "seconds": FREEZE_SECONDS}
    finally:
        monkey.paused.clear()


def drain(config: ChaosConfig, stack: StackSettings, workload: Workload, started: datetime) -> float:
    """Until every pair has its incident and every incident is settled; seconds taken."""
    began = time.monotonic()
    while time.monotonic() - began < config.drain_seconds:
        check, _ = truth.incidents_settled(stack, started)
        if check.ok and all(p.done for p in workload.pairs) and truth.executor_settled(stack).ok:
            break
        time.sleep(2)
    return round(time.monotonic() - began, 1)


def published(
    stack: StackSettings, start: truth.Offsets, started: datetime, until: datetime
) -> list[truth.TopicRecord]:
    """Every record since ``start``, read again (for up to OUTBOX_PATIENCE_SECONDS) while an
    outbox row written before ``until`` is not on its topic yet; what is still missing then
    is lost, and the outbox invariant says so."""
    deadline = time.monotonic() + OUTBOX_PATIENCE_SECONDS
    while True:
        time.sleep(2)
        records = truth.read_since(stack, start)
        missing = [p for p in truth.outbox_delivered(stack, started, records, until=until).problems if " 0×" in p]
        if not missing or time.monotonic() > deadline:
            return records
        log.info("%d outbox row(s) not on their topic yet, e.g. %s; reading again", len(missing), missing[0])


def test_chaos_soak(
    chaos_config: ChaosConfig, chaos_fleet: dict[str, str], stack: StackSettings, serde: AvroSerde
) -> None:
    config = chaos_config
    rng = random.Random(config.seed)
    token = executor_token()
    # The topics' ends first, then the clock: a row stamped at or after `started` began its
    # transaction after the ends were read, so it is among the records read back. The other
    # order (with `started` a second early) counted an audit anchor written in between, and
    # published before the ends were read, as lost.
    start_offsets = truth.end_offsets(stack, truth.topics(stack))
    started = datetime.now(UTC)
    pairs = estate(config, rng)

    workload = Workload(config, stack, pairs, started)
    approver = Approver(workload)
    monkey = Monkey(config.kill_every_seconds, {EXECUTOR.name: 2}, rng)
    began = time.monotonic()
    for thread in (workload, approver, monkey):
        thread.start()
    try:
        poisoned = poison.publish(stack, config.poison // 2)
        # the kill phase: every component at least once, and until every fault is injected
        rounds = len(targets())
        frozen: dict[str, Any] = {}
        while monkey.kills.total < rounds or not workload.all_injected:
            if not frozen and monkey.kills.total >= rounds // 2:
                frozen = freeze_an_executor(monkey, rng)
                poisoned |= poison.publish(stack, config.poison - config.poison // 2)
            time.sleep(1)
        monkey.stop.set()
        monkey.join(timeout=180)
        kill_phase = round(time.monotonic() - began, 1)
        wait_stack_healthy(stack)
        drained = drain(config, stack, workload, started)
    finally:
        for thread in (monkey, workload, approver):
            thread.stop.set()
        for thread in (monkey, workload, approver):
            thread.join(timeout=180)

    settled, statuses = truth.incidents_settled(stack, started)
    counts = truth.action_counts(token)
    # Rows written from here on (the audit's anchors go on) are not expected on the topics
    # read below; those written before have a moment to be published first.
    rows_until = datetime.now(UTC)
    records = published(stack, start_offsets, started, rows_until)
    opened = truth.Check("every injected breach opened an incident")
    opened.counts["pairs"] = len(pairs)
    opened.counts["opened"] = sum(1 for p in pairs if p.incident)
    opened.counts["already scaled, no breach"] = sum(1 for p in pairs if p.no_breach and not p.incident)
    opened.problems = [f"{p.shop} never opened an incident" for p in pairs if not p.done]
    forced = [p for p in pairs if p.bad_deploy]
    compensated = truth.Check("forced verification failures compensated")
    compensated.counts["forced"] = len(forced)
    undone = truth.compensated(stack, [p.incident for p in forced if p.incident])
    compensated.counts["compensated"] = sum(1 for p in forced if p.incident in undone)
    # a compensation while the service still breached goes to people (the health agent)
    compensated.counts["then escalated"] = sum(
        1 for p in forced if p.incident in undone and statuses.get(p.incident) == "ESCALATED"
    )
    # The bad deploy lands once the workload's poll sees the scale at the sim; a
    # verification that beats the poll (or a sim down at that moment) resolves the
    # incident. Counted, not failed; no compensation at all would fail.
    compensated.counts["bad deploy lost or late, resolved"] = sum(
        1 for p in forced if statuses.get(p.incident or "") == "RESOLVED"
    )
    compensated.problems = [
        f"{p.shop}: {statuses.get(p.incident or '')}"
        for p in forced
        if statuses.get(p.incident or "") not in ("COMPENSATED", "RESOLVED", "ESCALATED")
    ]
    if forced and not compensated.counts["compensated"]:
        compensated.problems.append("no forced failure compensated")
    checks = [
        opened,
        settled,
        compensated,
        truth.applied_once(counts),
        truth.approved_applied(records, serde, counts, truth.opened_since(stack, started)),
        truth.outbox_delivered(stack, started, records, until=rows_until),
        truth.audit_complete(stack, records),
        truth.audit_chain(),
        truth.dlq_only_poison(stack, started, poisoned),
        truth.executor_settled(stack),
        truth.transactions_closed(stack, started),
    ]

    print("\n[chaos] " + "\n[chaos] ".join(c.line() for c in checks), flush=True)

    # the duplicate-delivery pass
    for fault in call("GET", f"{url(SIM)}/faults"):
        call("DELETE", f"{url(SIM)}/faults/{fault['id']}")
    # Alertmanager is silenced while the fleet re-reads: a resolution it delivers meanwhile is
    # a new input (an AlertObserved), not an effect of reading a record twice.
    silence = call(
        "POST",
        f"{stack.alertmanager_url}/api/v2/silences",
        {
            "matchers": [{"name": "alertname", "value": ".+", "isRegex": True, "isEqual": True}],
            "startsAt": datetime.now(UTC).isoformat(),
            "endsAt": (datetime.now(UTC) + timedelta(hours=1)).isoformat(),
            "createdBy": "chaos-soak",
            "comment": "the duplicate-delivery pass measures the effects of re-reading only",
        },
    )["silenceID"]
    try:
        before = rewind.Effects.now(stack, token)
        rewind_began = time.monotonic()
        fleetctl("down", chaos_fleet)
        moved = rewind.rewind(stack)
        fleetctl("up", chaos_fleet)
        lag = rewind.caught_up(stack, timeout=config.drain_seconds)
        time.sleep(10)  # anything a re-read record would cause has had time to surface
        after = rewind.Effects.now(stack, token)
    finally:
        call("DELETE", f"{stack.alertmanager_url}/api/v2/silence/{silence}")
    checks.append(rewind.no_new_effects(before, after, moved, lag))

    report = {
        "config": asdict(config),
        "estate": config.estate,
        "seconds": {"killPhase": kill_phase, "drain": drained, "rewind": round(time.monotonic() - rewind_began, 1)},
        "kills": monkey.kills.report(),
        "frozen": frozen,
        "workload": asdict(workload.tally) | {"errors": workload.tally.errors[:20]},
        "ledger": str(LEDGER),
        "checks": {c.name: {"ok": c.ok, **c.counts, "problems": c.problems[:20]} for c in checks},
    }
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2))
    print("\n[chaos] " + "\n[chaos] ".join(c.line() for c in checks))
    print(f"[chaos] kills: {report['kills']}")
    print(f"[chaos] report: {REPORT}")
    assert all(c.ok for c in checks), "\n".join(c.line() for c in checks if not c.ok)
