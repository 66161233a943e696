"""What people are shown is what was signed (security review 3, M1 and L2), on the running
fleet: while a person's approval waits, a forger who can write ``incidents`` adds its own
DiagnosisConcluded ("approve at once", 0.99), a RecoveryProposed naming the pending
proposal (its "own reasoning"), an IncidentEscalated, and a diagnosis signed with another
member's key. Before, the audit folded them into the incident's status and the console
showed them on the approval page as the agents' diagnoses.

Now the audit checks each record's producer signature as the fleet does: the forgeries are
in its log, marked unverified, and move no status; the approval page lists as diagnoses only
what the agents signed, and shows the forgeries in the timeline marked unverified.

A record signed by its real producer but carrying a repeated ``ce_*`` header (an
IncidentEscalated with the health agent's own signature, its ce_correlationid given twice)
is refused everywhere: dead-lettered by the fleet (the incident is not escalated) and
stored unverified by the audit.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest
from flotilla_ops.samples import sample_value

from flotilla.contracts import load_contracts
from flotilla.envelope import Envelope
from flotilla.fleet import AUDIT, CONSOLE, DIAGNOSTIC, EXECUTOR, HEALTH, POLICY, REMEDIATION, Member, url
from flotilla.provenance import SIGNATURE_HEADER, sign_fact
from flotilla.records import DiagnosisConcluded, IncidentEscalated, RecoveryProposed
from tests.support.producing import ordered_producer

from .fleet import APPROVER, Fleet, Seen, Watch, awaiting_approval

pytestmark = pytest.mark.timeout(300)

SCHEMAS = {c.full_name: c.schema for c in load_contracts()}
FORGED_SUMMARY = "approve at once: forged"
Headers = Callable[[bytes], list[tuple[str, bytes]]]  # a record's headers, given its payload


def _forged(record_type: str, producer: Member, incident: str, cause: Seen, **fields: Any) -> tuple[Envelope, dict]:
    envelope = Envelope(
        type=record_type, source=f"/flotilla/{producer.name}", correlationid=incident, causationid=cause.envelope.id
    )
    return envelope, sample_value(SCHEMAS[record_type], eventId=envelope.id, incidentId=incident, **fields)


def _publish(fleet: Fleet, envelope: Envelope, value: dict[str, Any], headers: Headers) -> None:
    producer = ordered_producer(fleet.stack.kafka_bootstrap)
    payload = fleet.serde.serialize("incidents", envelope.type, value)
    producer.produce("incidents", key=envelope.correlationid, value=payload, headers=headers(payload))
    assert producer.flush(10) == 0


def _signed(fleet: Fleet, envelope: Envelope, by: Member) -> Headers:
    signer = fleet.producer_signer(by.name)
    assert signer is not None
    return lambda payload: [*envelope.headers(), (SIGNATURE_HEADER, sign_fact(signer, envelope, payload).encode())]


def _quarantined(watch: Watch, envelope: Envelope, reason: str, says: str) -> None:
    notice = watch.wait(
        lambda s: s.kind == "DeadLetterQuarantined" and str(s.value.get("originalEventId")) == envelope.id,
        timeout=60,
        what=f"a quarantine of {envelope.type}",
    )
    assert notice.value["tags"]["reason"] == reason, notice.value
    assert says in notice.value["errorMessage"], notice.value


@contextmanager
def _console(token: str) -> Iterator[httpx.Client]:
    """A console session signed in with ``token`` (the login form's CSRF token, a cookie)."""
    with httpx.Client(base_url=url(CONSOLE), timeout=15, follow_redirects=True) as client:
        yield _signed_in(client, token)


def _signed_in(client: httpx.Client, token: str) -> httpx.Client:
    form = client.get("/login").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', form)
    assert csrf, form[:500]
    signed_in = client.post("/login", data={"token": token, "csrf": csrf.group(1), "next": "/approvals"})
    assert signed_in.status_code == 200 and "Signed in as" in signed_in.text, signed_in.text[:500]
    return client


def _audited(fleet: Fleet, event_id: str, timeout: float = 60) -> tuple[str | None, str | None, str | None]:
    """(verified_by, unverified, ce_correlationid) of the audit's entry for ``event_id``."""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(fleet.stack.pg_dsn(AUDIT.database or "")) as conn:
            row = conn.execute(
                "SELECT verified_by, unverified, ce_correlationid FROM audit_log "
                "WHERE ce_id = %s AND topic = 'incidents'",
                (event_id,),
            ).fetchone()
        if row is not None:
            return row[0], row[1], row[2]
        assert time.monotonic() < deadline, f"the audit has no entry for {event_id}"
        time.sleep(0.5)


def _incident_status(fleet: Fleet, incident: str) -> str | None:
    listed = fleet.call(AUDIT, "GET", "/incidents")["incidents"]
    return next((i["status"] for i in listed if i["incidentId"] == incident), None)


def test_forgeries_are_not_the_agents_on_the_approval_page_nor_move_the_audit(fleet: Fleet, watch: Watch) -> None:
    incident, request = awaiting_approval(fleet, watch)
    proposal, digest = str(request.value["proposalId"]), str(request.value["digest"])
    reasoning = {
        "summary": FORGED_SUMMARY,
        "evidence": [],
        "confidence": 0.99,
        "reasoner": "rules",
        "model": None,
        "tokenUsage": {"promptTokens": 0, "completionTokens": 0},
    }
    now = datetime.now(UTC)
    where = {"service": "checkout-api", "environment": "production"}
    diagnosis = _forged(
        DiagnosisConcluded.TYPE, DIAGNOSTIC, incident, request, causeCategory="capacity", reasoning=reasoning,
        concludedAt=now, **where,
    )  # fmt: skip
    by_another_key = _forged(
        DiagnosisConcluded.TYPE, DIAGNOSTIC, incident, request, causeCategory="capacity", reasoning=reasoning,
        concludedAt=now, **where,
    )  # fmt: skip
    own_reasoning = _forged(RecoveryProposed.TYPE, REMEDIATION, incident, request, proposalId=proposal,
                            reasoning=reasoning)  # fmt: skip
    escalation = _forged(IncidentEscalated.TYPE, POLICY, incident, request, reason="forged: closed by nobody")
    # the health agent's own signature, but its correlation id given twice
    doubled = _forged(IncidentEscalated.TYPE, HEALTH, incident, request, reason="forged: signed, header doubled")
    doubled_headers = _signed(fleet, doubled[0], HEALTH)

    for envelope, value in (diagnosis, own_reasoning, escalation):
        _publish(fleet, envelope, value, lambda _payload, e=envelope: e.headers())  # unsigned
    _publish(fleet, *by_another_key, _signed(fleet, by_another_key[0], EXECUTOR))
    _publish(
        fleet,
        *doubled,
        lambda payload: [("ce_correlationid", incident.encode()), *doubled_headers(payload)],
    )

    # the fleet refuses every one of them
    for envelope in (diagnosis[0], own_reasoning[0], escalation[0]):
        _quarantined(watch, envelope, "unauthorized", "carries no ce_signature")
    _quarantined(watch, by_another_key[0], "unauthorized", "which is not trusted")
    _quarantined(watch, doubled[0], "undecodable", "repeated CloudEvents header(s): ce_correlationid")
    forged_ids = {e.id for e, _ in (diagnosis, by_another_key, own_reasoning, escalation)}

    # the audit has every one of them, marked, and they moved nothing
    entries = fleet.audit_timeline(incident, lambda found: forged_ids <= {e["eventId"] for e in found}, timeout=60)
    forged = {e["eventId"]: e for e in entries if e["eventId"] in forged_ids}
    assert set(forged) == forged_ids, sorted(e["type"] for e in entries)
    assert all(e["verified"] is False and e["verifiedBy"] is None for e in forged.values())
    assert forged[by_another_key[0].id]["unverified"].startswith("unknown-key")
    # the doubled record: kept, unverified, and filed under no incident (its correlation is two)
    verified_by, why, filed_under = _audited(fleet, doubled[0].id)
    assert verified_by is None and why is not None and "repeated CloudEvents header" in why
    assert filed_under is None
    genuine = [e for e in entries if e["eventId"] not in forged_ids and not e["topic"].endswith(".dlq")]
    assert genuine and all(e["verified"] for e in genuine), [(e["type"], e["unverified"]) for e in genuine]
    assert _incident_status(fleet, incident) == "AWAITING_APPROVAL"  # not ESCALATED

    # the approval page: the agents' own diagnosis and plan only; the forgeries marked in the timeline
    with _console(APPROVER) as console:
        page = console.get(f"/approvals/{proposal}")
        assert page.status_code == 200
        text = html.unescape(page.text)
        assert FORGED_SUMMARY not in text
        evidence = " ".join(text.split('id="evidence"', 1)[1].split("</section>", 1)[0].split())
        assert "signed by diagnostic-agent" in evidence and "signed by remediation-agent" in evidence
        assert "record(s) of this incident are not signed by their producer" in evidence
        marked = re.findall(r'<tr class="[^"]*unverified"><td>(\d+)</td>', page.text)
        seqs = {str(e["seq"]) for e in forged.values()}
        assert seqs <= set(marked), (seqs, marked)
        assert f"{len(marked)} record(s)" in evidence  # only unverified rows are marked

        timeline = html.unescape(console.get(f"/incidents/{incident}").text)
        outcome = timeline.split('id="outcome"', 1)[1].split("</section>", 1)[0]
        assert "IncidentEscalated" not in outcome
        assert "no ce_signature" in timeline

    # the person's decision still counts, and the incident goes on as if nothing was written
    fleet.approve(proposal, digest)
    watch.wait(
        lambda s: s.kind == "RecoveryExecuted" and s.envelope.correlationid == incident,
        timeout=60,
        what="the real RecoveryExecuted",
    )
    deadline = time.monotonic() + 30
    while _incident_status(fleet, incident) not in ("EXECUTED", "RESOLVED") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _incident_status(fleet, incident) in ("EXECUTED", "RESOLVED")
    assert not [s for s in watch.of(incident, "IncidentEscalated") if s.envelope.id not in forged_ids]
