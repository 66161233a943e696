"""`make demo`: a slow checkout service, from detection to a verified recovery, live.

Injects a fault into the sim (payments-api slows down, so checkout-api's p95 climbs),
then follows the incident on Kafka and prints each fact as it lands, with the time
since the fault. The fleet sees the sim only as an estate is seen: the health agent reads
Prometheus (which scrapes the sim) and takes Alertmanager's alerts (from Prometheus'
rule on the same latency); whichever comes first opens the incident, the other joins it,
and the demo says which opened it and which alert fired. At HumanApprovalRequired it
prints the exact command that approves the proposal (or approves by itself with DEMO_AUTO_APPROVE=1). It ends when the
health agent verifies the recovery, then asks the audit service to verify its hash
chain and signatures. Exit code 0 only for a verified recovery and a verified chain.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from flotilla import actions
from flotilla.envelope import Envelope
from flotilla.fleet import AUDIT, POLICY, SIM, url
from flotilla.registry import registry_client
from flotilla.serde import AvroSerde, SerdeError
from flotilla.settings import load_settings
from flotilla.tailing import tail_consumer

SERVICE = os.environ.get("DEMO_SERVICE", "checkout-api")
FAULT = {"service": "payments-api", "kind": "dependency-slow"}
APPROVER_TOKEN = os.environ.get("DEMO_APPROVER_TOKEN", "alice-token")
AUTO_APPROVE = os.environ.get("DEMO_AUTO_APPROVE") == "1"
TIMEOUT_S = float(os.environ.get("DEMO_TIMEOUT_SECONDS", "1200"))
# Where the fleet answers: 127.0.0.1 locally; docker compose points these at the containers.
SIM_URL = os.environ.get("FLOTILLA_SIM_URL", url(SIM))
POLICY_URL = os.environ.get("FLOTILLA_POLICY_URL", url(POLICY))
AUDIT_URL = os.environ.get("FLOTILLA_AUDIT_URL", url(AUDIT))

SUCCESS = "RecoveryCompleted"
OPENING = {"ServiceLatencyIncreased", "ServiceDegraded"}  # what opens an incident
FAILURE = {"RecoveryFailed", "IncidentEscalated", "CommandDenied", "ApprovalExpired", "RecoveryRejected"}

# What to show of each record: the fields that tell the story.
SHOWN = {
    "ServiceLatencyIncreased": ("service", "p95LatencyMs", "thresholdMs"),
    "ServiceDegraded": ("service", "signal", "summary"),
    "AlertObserved": ("service", "signal"),
    "DiagnosisRequested": ("service", "symptom"),
    "DiagnosticJobStarted": ("jobId", "jobKind"),
    "DependencyFailureSuspected": ("suspectedDependency", "failureMode"),
    "DiagnosisConcluded": ("causeCategory", "summary"),
    "RecoveryProposed": ("proposalId", "digest"),
    "HumanApprovalRequired": ("proposalId", "requiredRole", "deadline"),
    "RecoveryApproved": ("approvedBy", "auto"),
    **{spec.kind: ("idempotencyKey", *spec.key_fields) for spec in actions.SPECS},
    "RecoveryExecuted": ("idempotencyKey", "fencingEpoch", "outcome"),
    "CommandFailed": ("idempotencyKey", "errorClass", "errorMessage"),
    "RecoveryCompleted": ("service", "p95LatencyMs"),
    "RecoveryFailed": ("stage",),
    "IncidentEscalated": ("reason", "escalatedTo"),
    "CommandDenied": ("reasons",),
    "ApprovalExpired": ("deadline",),
}


def http(method: str, address: str, body: object | None = None, token: str | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(address, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def summary(kind: str, value: dict[str, Any]) -> str:
    parts = []
    for name in SHOWN.get(kind, ()):
        if name in value and value[name] is not None:
            shown = value[name]
            if isinstance(shown, float):
                shown = f"{shown:.0f}"
            parts.append(f"{name}={shown}")
    if kind == "RecoveryProposed":
        steps = value.get("steps") or []
        parts.insert(0, f"steps={[s.get('idempotencyKey') for s in steps]}")
    alert = value.get("alert")
    if isinstance(alert, dict):  # Alertmanager's alert, as the health agent received it
        status, fingerprint = alert.get("status"), alert.get("fingerprint")
        parts.insert(0, f"alert={alert.get('alertName')} ({status}, fingerprint {fingerprint})")
    return " ".join(parts)


def opened_by(kind: str, value: dict[str, Any]) -> str:
    if kind == "ServiceDegraded":
        alert = value.get("alert") or {}
        return f"opened by Alertmanager's alert {alert.get('alertName')} (from Prometheus' rule)"
    return "opened by the health agent's own reading of Prometheus (PromQL p95 against the threshold)"


def approve_command(proposal: str, digest: str) -> str:
    """What a person runs to approve: the CLI shows the proposal, asks, and approves only
    this digest (the demo's approver token; a real one comes from FLOTILLA_TOKEN)."""
    cli = ".venv/bin/flotilla" if Path(".venv/bin/flotilla").exists() else "flotilla"  # the checkout's, or the image's
    return f"FLOTILLA_TOKEN={APPROVER_TOKEN} {cli} approve {proposal} --digest {digest}"


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # live, even through make
    settings = load_settings()
    serde = AvroSerde(registry_client(settings.schema_registry_url))
    consumer = tail_consumer(settings.kafka_client(), ["incidents", "commands"])
    http("POST", f"{SIM_URL}/reset", {})
    fault = http("POST", f"{SIM_URL}/faults", FAULT)
    started = time.monotonic()
    print(f"[{0:7.2f}s] fault injected: {FAULT['service']} {FAULT['kind']} (id {fault.get('id')}); watching {SERVICE}")
    incident: str | None = None
    outcome: str | None = None
    while time.monotonic() - started < TIMEOUT_S and outcome is None:
        msg = consumer.poll(0.2)
        if msg is None or msg.error():
            continue
        try:
            envelope = Envelope.from_headers(msg.headers())
            decoded = serde.deserialize(msg.value())
        except (ValueError, SerdeError):
            continue
        kind = decoded.record_name.rsplit(".", 1)[-1]
        value = decoded.value
        if incident is None:
            if kind not in OPENING or value.get("service") != SERVICE:
                continue
            incident = envelope.correlationid
        if envelope.correlationid != incident:
            continue
        elapsed = time.monotonic() - started
        print(f"[{elapsed:7.2f}s] {msg.topic():<9} {kind:<27} {summary(kind, value)}", flush=True)
        if kind in OPENING:
            print(f"{'':10} {incident} {opened_by(kind, value)}")
        if kind == "HumanApprovalRequired":
            command = approve_command(str(value["proposalId"]), str(value["digest"]))
            if AUTO_APPROVE:
                print(f"{'':10} DEMO_AUTO_APPROVE=1: approving as the approver")
                http(
                    "POST",
                    f"{POLICY_URL}/approvals/{value['proposalId']}/approve",
                    {"digest": value["digest"]},
                    APPROVER_TOKEN,
                )
            else:
                print(
                    f"{'':10} waiting for a human. To approve this exact command, run:\n\n    {command}\n", flush=True
                )
        if kind == SUCCESS:
            outcome = "recovered"
        elif kind in FAILURE:
            outcome = f"not recovered ({kind})"
    consumer.close()
    if outcome is None:
        print(f"no outcome within {TIMEOUT_S:.0f}s")
        return 1
    print(f"incident {incident}: {outcome}")
    try:
        verdict = http("GET", f"{AUDIT_URL}/verify")
    except urllib.error.URLError as exc:
        print(f"audit verification unavailable: {exc}")
        return 1
    print(f"audit chain: {json.dumps(verdict)}")
    return 0 if outcome == "recovered" and verdict.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
