"""Driving and watching the running fleet from end-to-end tests."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from flotilla.authority import Signer
from flotilla.envelope import Envelope
from flotilla.fleet import AGENTS, AUDIT, DLQ_RECONCILER, EXECUTOR, HEALTH, POLICY, SIM, Member, url
from flotilla.keys import load_private_key, public_key_text
from flotilla.provenance import SIGNATURE_HEADER, producer_of, sign_fact
from flotilla.serde import AvroSerde, SerdeError
from flotilla.settings import StackSettings
from flotilla.tailing import tail_consumer
from tests.support.producing import ordered_producer

REPO_ROOT = Path(__file__).resolve().parents[2]
FLEETCTL = REPO_ROOT / "infra" / "local" / "fleetctl.py"
APPROVER = "alice-token"
VIEWER = "bob-token"


class HttpError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        super().__init__(f"HTTP {status}: {body}")


def http(method: str, address: str, body: object | None = None, token: str | None = None, timeout: float = 15) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(address, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = raw.decode(errors="replace")
        raise HttpError(exc.code, parsed) from None
    return json.loads(raw) if raw else None


@dataclass
class Seen:
    """A decoded record seen on a topic."""

    topic: str
    kind: str  # short record name, e.g. RecoveryExecuted
    envelope: Envelope
    value: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class Watch:
    """Everything that lands on incidents and commands from now on, decoded."""

    def __init__(self, consumer: Consumer, serde: AvroSerde) -> None:
        self._consumer = consumer
        self._serde = serde
        self.seen: list[Seen] = []

    def _pump(self, timeout: float) -> None:
        msg = self._consumer.poll(timeout)
        if msg is None or msg.error():
            return
        try:
            envelope = Envelope.from_headers(msg.headers())
            decoded = self._serde.deserialize(msg.value())
        except (ValueError, SerdeError):
            return
        self.seen.append(Seen(msg.topic() or "", decoded.record_name.rsplit(".", 1)[-1], envelope, decoded.value))

    def wait(self, match: Callable[[Seen], bool], timeout: float = 60, what: str = "record") -> Seen:
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            for item in self.seen[checked:]:
                if match(item):
                    return item
            checked = len(self.seen)
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout:.0f}s; saw {[s.kind for s in self.seen][-30:]}")
            self._pump(0.2)

    def kind(self, kind: str, incident: str | None = None, timeout: float = 60) -> Seen:
        return self.wait(
            lambda s: s.kind == kind and (incident is None or s.envelope.correlationid == incident),
            timeout,
            what=f"{kind} for {incident or 'any incident'}",
        )

    def settle(self, seconds: float) -> None:
        """Keep reading for a while (to assert something did NOT happen)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._pump(0.2)

    def of(self, incident: str, kind: str | None = None) -> list[Seen]:
        return [s for s in self.seen if s.envelope.correlationid == incident and (kind is None or s.kind == kind)]

    def close(self) -> None:
        self._consumer.close()


class Fleet:
    def __init__(self, stack: StackSettings, serde: AvroSerde) -> None:
        self.stack = stack
        self._producer_signers: dict[str, Signer | None] = {}
        self.serde = serde

    def watch(self) -> Watch:
        return Watch(tail_consumer(self.stack.kafka_bootstrap, ["incidents", "commands"]), self.serde)

    def call(self, member: Member, method: str, path: str, body: object | None = None, token: str | None = None) -> Any:
        return http(method, url(member) + path, body, token)

    def sim(self, method: str, path: str, body: object | None = None) -> Any:
        """The sim's read API and test controls (services, faults, reset, settings): no token."""
        return self.call(SIM, method, path, body)

    def sim_action(self, method: str, path: str, body: object | None = None) -> Any:
        """The sim's action API (``/actions``), as the executor calls it: with the action token."""
        return self.call(SIM, method, path, body, self.sim_action_token)

    @cached_property
    def sim_action_token(self) -> str:
        """The token the local fleet gave the sim and the executor (fleetctl made it on ``up``)."""
        done = subprocess.run(
            [sys.executable, str(FLEETCTL), "sim-token-file"], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return Path(done.stdout.strip()).read_text().strip()

    @cached_property
    def secrets_dir(self) -> Path:
        """Where the local fleet keeps its secrets (fleetctl made them on ``up``)."""
        done = subprocess.run(
            [sys.executable, str(FLEETCTL), "secrets-dir"], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return Path(done.stdout.strip())

    def producer_key_file(self, member: str) -> Path | None:
        """Where ``member``'s signing key is (flotilla.provenance); None for a source that is
        no member of the fleet."""
        done = subprocess.run(
            [sys.executable, str(FLEETCTL), "signing-key-file", member], capture_output=True, text=True, timeout=30
        )
        return Path(done.stdout.strip()) if done.returncode == 0 else None

    def producer_signer(self, member: str) -> Signer | None:
        """The key ``member`` signs its records with; None for no member of the fleet."""
        if member not in self._producer_signers:
            path = self.producer_key_file(member)
            self._producer_signers[member] = Signer(load_private_key(path)) if path else None
        return self._producer_signers[member]

    def producer_keys(self) -> dict[str, list[str]]:
        """Every member's public key, as FLOTILLA_PRODUCER_KEYS holds them."""
        keys = {}
        for member in AGENTS:
            signer = self.producer_signer(member.name)
            assert signer is not None, member.name
            keys[member.name] = [public_key_text(signer.public_key)]
        return keys

    @cached_property
    def policy_signer(self) -> Signer:
        """The policy service's own key: for tests that issue a command as it would."""
        return Signer(load_private_key(self.secrets_dir / "authorization-signing-key.pem"))

    @cached_property
    def agent_signer(self) -> Signer:
        """The remediation agent's own key: for tests that act as another agent instance."""
        return Signer(load_private_key(self.secrets_dir / "proposal-signing-key.pem"))

    @contextmanager
    def fresh_watch(self, service: str | None = None) -> Iterator[Watch]:
        """A tail of incidents + commands from now on, with the sim reset and ``service``
        settled first (so a test opens a fresh incident); the sim is reset again after."""
        self.reset_sim()
        self.wait_until_healthy(service or DEMO_SERVICE)
        w = self.watch()
        try:
            yield w
        finally:
            w.close()
            self.reset_sim()

    def reset_sim(self) -> None:
        self.sim("POST", "/reset", {})

    def fault(self, service: str, kind: str, **extra: Any) -> Any:
        return self.sim("POST", "/faults", {"service": service, "kind": kind, **extra})

    def approve(self, proposal: str, digest: str, token: str = APPROVER) -> Any:
        return self.call(POLICY, "POST", f"/approvals/{proposal}/approve", {"digest": digest}, token)

    def reject(self, proposal: str, digest: str, token: str = APPROVER, reason: str = "not now") -> Any:
        return self.call(POLICY, "POST", f"/approvals/{proposal}/reject", {"digest": digest, "reason": reason}, token)

    def audit_verify(self) -> Any:
        return self.call(AUDIT, "GET", "/verify")

    def audit_timeline(
        self, incident: str, until: Callable[[list[dict[str, Any]]], bool], timeout: float = 30
    ) -> list[dict[str, Any]]:
        """The incident's timeline from audit once ``until`` holds for it (audit consumes
        on its own pace); the last one read when ``timeout`` runs out."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                entries: list[dict[str, Any]] = self.call(AUDIT, "GET", f"/incidents/{incident}/timeline")["timeline"]
            except HttpError:  # 404 until audit has recorded the incident
                entries = []
            if until(entries) or time.monotonic() > deadline:
                return entries
            time.sleep(0.2)

    def dlq(self, method: str, path: str, body: object | None = None, token: str | None = None) -> Any:
        return self.call(DLQ_RECONCILER, method, path, body, token)

    def wait_until_healthy(self, service: str, timeout: float = 60) -> None:
        """Until the health agent has seen the service healthy again, closed its breach and
        decided any verification window (so the next fault opens a new incident rather
        than continuing the last one or failing its verification)."""
        import psycopg

        from services.health_agent.scrape import settled

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with psycopg.connect(self.stack.pg_dsn(HEALTH.database)) as conn:
                if settled(conn, service):
                    return
            time.sleep(0.2)
        raise AssertionError(f"{service} still breaching, or its incident or verification open, after {timeout:.0f}s")

    def executor_pending(self, idempotency_key: str) -> bool:
        """Whether the executor has marked the key PENDING (it is about to act or acting)."""
        import psycopg

        with psycopg.connect(self.stack.pg_dsn(EXECUTOR.database)) as conn:
            row = conn.execute("SELECT state FROM executions WHERE idempotency_key = %s", (idempotency_key,)).fetchone()
        return row is not None and row[0] == "PENDING"

    def pid(self, service: str) -> int:
        """The process id of a member, from its supervisor."""
        done = subprocess.run(
            [sys.executable, str(FLEETCTL), "pid", service],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stdout + done.stderr
        return int(done.stdout.strip())

    def kill(self, service: str) -> None:
        """SIGKILL a member's process (supervisord starts it again)."""
        import os
        import signal

        os.kill(self.pid(service), signal.SIGKILL)

    def restart(self, service: str) -> None:
        done = subprocess.run(
            [sys.executable, str(FLEETCTL), "restart", service],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def produce(
    fleet: Fleet,
    topic: str,
    key: str,
    record_type: str,
    value: dict[str, Any],
    envelope: Envelope,
    *,
    signed: bool = True,
) -> None:
    """Publish a record as the producer its ``ce_source`` names would: valid against its
    registered schema and, unless ``signed`` is False (a forger without the key), signed
    with that member's own key."""
    producer = ordered_producer(fleet.stack.kafka_bootstrap)
    payload = fleet.serde.serialize(topic, record_type, value)
    headers = envelope.headers()
    signer = fleet.producer_signer(producer_of(envelope.source) or "") if signed else None
    if signer is not None:
        headers.append((SIGNATURE_HEADER, sign_fact(signer, envelope, payload).encode()))
    producer.produce(topic, key=key, value=payload, headers=headers)
    assert producer.flush(10) == 0


def counter_proposal(
    original: Seen, replicas: int, signer: Signer | None, *, digest: str | None = None
) -> tuple[dict[str, Any], Envelope]:
    """Another agent instance's proposal for the same incident and resource: scale to
    ``replicas``, attested by ``signer`` (None: by nobody, as a forger would send it).
    ``digest`` replaces the right one after signing (a broken proposal)."""
    import uuid
    from datetime import UTC, datetime

    from flotilla.authority import attest_proposal
    from flotilla.commands import idempotency_key
    from flotilla.digest import command_digest

    proposal_id = str(uuid.uuid4())
    steps = []
    for step in original.value["steps"]:
        changed = {**step, "commandId": str(uuid.uuid4()), "proposalId": proposal_id, "replicas": replicas}
        changed["idempotencyKey"] = idempotency_key("ScaleService", changed)
        steps.append(changed)
    # another instance of the remediation agent: the same member, so produce() signs the
    # record with its key (a forger without it is refused before any check of the body)
    envelope = original.envelope.caused(PROPOSED, "/flotilla/remediation-agent")
    value = {
        **{k: v for k, v in original.value.items() if k != "attestation"},
        "eventId": envelope.id,
        "proposalId": proposal_id,
        "steps": steps,
    }
    value["digest"] = command_digest(steps)
    if signer is not None:
        value = attest_proposal(signer, value, now=datetime.now(UTC))
    if digest is not None:
        value["digest"] = digest
    return value, envelope


PROPOSED = "dev.flotilla.decisions.RecoveryProposed"


DEMO_SERVICE = "checkout-api"  # production: its recoveries need a person


def open_incident(fleet: Fleet, watch: Watch, service: str = DEMO_SERVICE, dependency: str = "payments-api") -> str:
    """Slow down the service's payments dependency and return the incident the health agent opens."""
    fleet.fault(dependency, "dependency-slow")
    opened = watch.wait(
        lambda s: s.kind == "ServiceLatencyIncreased" and s.value.get("service") == service,
        timeout=60,
        what=f"ServiceLatencyIncreased for {service}",
    )
    return opened.envelope.correlationid


def awaiting_approval(fleet: Fleet, watch: Watch) -> tuple[str, Seen]:
    incident = open_incident(fleet, watch)
    return incident, watch.kind("HumanApprovalRequired", incident, timeout=90)


def group_members(fleet: Fleet, group: str) -> int:
    """How many members of ``group`` have partitions assigned right now."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": fleet.stack.kafka_bootstrap})
    described = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    return sum(1 for m in described.members if m.assignment.topic_partitions)
