"""The business work of each link of Flotilla's incident chain, for another engine to run.

benchmarks/dbos_baseline.py (``--work fleet``) runs the chain as one DBOS workflow; a
fair race needs each of its steps to do what the fleet's member does for that record,
with the fleet's own code, so the only difference left is how the steps are carried
(Kafka, outboxes and consumer groups, or DBOS's checkpoints):

- every record is validated and Avro-encoded against the registry's contract and signed
  by its producer (``flotilla.outbox.Outbox.row``), and the next step verifies that
  signature and decodes it, as the consuming member's loop does;
- the diagnosis reads the evidence around the service from Prometheus and asks the rules
  reasoner; the proposal reads it again, plans, and is attested (Ed25519);
- the approval checks the attestation and the proposal, asks the sim for the target's
  replicas, lets the Cedar policies decide and signs each command;
- the execution verifies the command's authorization and calls the sim's action API
  with a fencing token (which the caller takes from its own lease table).

Left out, each cheap next to the above: the diagnostic agent's baselines read, the
policy service's check that the diagnosis was a fact it saw, the dedupe claims and
incident-state rows (the engine's own checkpoints stand in for them).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flotilla_evidence import EvidenceSource
from flotilla_reasoning import RulesReasoner
from flotilla_reasoning.records import diagnosis_record, read_diagnosis

from flotilla import fleet
from flotilla.authority import Grant, Signer, attest_proposal, verify_command, verify_proposal
from flotilla.envelope import Envelope
from flotilla.keys import Keyring
from flotilla.outbox import Outbox
from flotilla.provenance import Provenance
from flotilla.records import DiagnosisRequested, RecoveryProposed, ServiceLatencyIncreased
from flotilla.serde import AvroSerde
from flotilla.typedrecord import Record
from services.diagnostic_agent.handlers import evidence_for
from services.executor.commands import from_record
from services.executor.execution import Applied
from services.executor.outcomes import recovery_executed
from services.executor.targets import SimTarget
from services.policy.commands import command_record, epoch_ms
from services.policy.decide import Outcome, PolicyEngine
from services.policy.inventory import SimInventory
from services.policy.proposals import read_proposal
from services.policy.records import auto_approval, issue_commands
from services.remediation_agent.plan import proposal_value

# The producers of the chain's records, by the fleet's member names (flotilla.provenance).
MEMBERS = (fleet.HEALTH, fleet.DIAGNOSTIC, fleet.REMEDIATION, fleet.POLICY, fleet.EXECUTOR)
COMMAND_TTL = timedelta(minutes=5)  # the remediation agent's default


@dataclass(frozen=True)
class Emitted:
    """One record as an outbox row would carry it: plain data, so an engine can checkpoint it."""

    envelope: dict[str, Any]
    payload: bytes
    signature: str

    @property
    def type(self) -> str:
        return str(self.envelope["type"])

    def as_envelope(self) -> Envelope:
        return Envelope(**self.envelope)


class ChainBroken(RuntimeError):
    """A link did not give the record the auto-authorized chain needs (the race is void)."""


class FleetWork:
    """Each link's work, with a signing key per member (made here: nothing else trusts them)."""

    def __init__(self, *, evidence: EvidenceSource, serde: AvroSerde, sim_url: str, action_token: str) -> None:
        self.evidence = evidence
        self.serde = serde
        self._signers = signers = {m.name: Signer(Ed25519PrivateKey.generate()) for m in MEMBERS}
        self._outboxes = {name: Outbox(serde, signer=signer) for name, signer in signers.items()}
        self._sources = {name: f"/flotilla/{name}" for name in signers}
        self._provenance = Provenance({name: Keyring([s.public_key]) for name, s in signers.items()})
        self._proposers = Keyring([signers[fleet.REMEDIATION.name].public_key])
        self._authorities = Keyring([signers[fleet.POLICY.name].public_key])
        self.reasoner = RulesReasoner()
        self.engine = PolicyEngine.from_directory()
        self.inventory = SimInventory(sim_url)
        self.target = SimTarget(sim_url, action_token)

    # ------------------------------------------------------------ records

    def _emit(self, member: str, record: Record, envelope: Envelope) -> Emitted:
        row = self._outboxes[member].row(record, envelope)
        return Emitted(dataclasses.asdict(envelope), bytes(row[4]), str(row[13]))

    def _caused(self, member: str, record: Record, cause: Emitted) -> Emitted:
        return self._emit(member, record, cause.as_envelope().caused(record.TYPE, self._sources[member]))

    def _receive(self, emitted: Emitted) -> dict[str, Any]:
        """What the consuming member's loop does first: believe the producer, then decode."""
        self._provenance.verify(emitted.as_envelope(), emitted.payload, emitted.signature)
        value: dict[str, Any] = self.serde.deserialize(emitted.payload).value
        return value

    # -------------------------------------------------------------- links

    def detected(self, incident_id: str, service: str, environment: str, p95_ms: float, threshold_ms: float) -> Emitted:
        """The health agent's ServiceLatencyIncreased, opening the incident."""
        record = ServiceLatencyIncreased(
            incident_id=incident_id,
            service=service,
            environment=environment,
            p95_latency_ms=p95_ms,
            threshold_ms=threshold_ms,
            window_seconds=5,
            observed_at=datetime.now(UTC),
        )
        source = self._sources[fleet.HEALTH.name]
        return self._emit(
            fleet.HEALTH.name, record, Envelope(type=record.TYPE, source=source, correlationid=incident_id)
        )

    def requested(self, detected: Emitted) -> Emitted:
        """The health agent's DiagnosisRequested, caused by the breach it recorded."""
        fact = self._receive(detected)
        request = DiagnosisRequested(
            incident_id=fact["incidentId"],
            service=fact["service"],
            environment=fact["environment"],
            symptom="latency",
            trigger_event_id=detected.envelope["id"],
            requested_at=datetime.now(UTC),
        )
        return self._caused(fleet.HEALTH.name, request, detected)

    def diagnosed(self, requested: Emitted) -> Emitted:
        """The diagnostic agent: the evidence around the service, then the rules reasoner."""
        request = DiagnosisRequested.from_value(self._receive(requested))
        topology = self.evidence.snapshot(around=request.service, environment=request.environment)
        diagnosis = self.reasoner.diagnose(evidence_for(request, topology))
        return self._caused(
            fleet.DIAGNOSTIC.name, diagnosis_record(diagnosis, job_id=None, now=datetime.now(UTC)), requested
        )

    def proposed(self, diagnosed: Emitted) -> Emitted:
        """The remediation agent: the evidence again, a plan, its commands, attested."""
        diagnosis = read_diagnosis(diagnosed.type, self._receive(diagnosed))
        topology = self.evidence.snapshot(around=diagnosis.service, environment=diagnosis.environment)
        plan = self.reasoner.propose(diagnosis, topology)
        now = datetime.now(UTC)
        value = proposal_value(
            plan, proposal_id=str(uuid.uuid4()), proposed_by=fleet.REMEDIATION.name, now=now, ttl=COMMAND_TTL
        )
        attested = attest_proposal(self._signers[fleet.REMEDIATION.name], value, now=now)
        return self._caused(fleet.REMEDIATION.name, RecoveryProposed.from_value(attested), diagnosed)

    def approved(self, proposed: Emitted) -> list[Emitted]:
        """The policy service: attestation, the proposal's checks, replicas from the sim, the
        Cedar decision; RecoveryApproved and each command, signed."""
        value = self._receive(proposed)
        verify_proposal(self._proposers, value)
        proposal = read_proposal(value, correlation_id=proposed.envelope["correlationid"])
        now = datetime.now(UTC)
        decision = self.engine.decide(proposal.facts(self.inventory.current_replicas), epoch_ms(now))
        if decision.outcome is not Outcome.AUTO:
            raise ChainBroken(f"{proposal.incident_id}: policy says {decision.outcome} ({decision.reasons})")
        approval = auto_approval(proposal, decision.policy_ids, approved_by=fleet.POLICY.name, at=now)
        emitted = [self._caused(fleet.POLICY.name, approval, proposed)]
        issue_commands(
            lambda record, envelope, _key: emitted.append(self._emit(fleet.POLICY.name, record, envelope)),
            cause=emitted[0].as_envelope(),
            source=self._sources[fleet.POLICY.name],
            commands=[command_record(step) for step in proposal.steps],
            signer=self._signers[fleet.POLICY.name],
            decision=Grant.AUTO,
            approved_by=fleet.POLICY.name,
            proposal_digest=proposal.digest,
            at=now,
        )
        return emitted

    def resource(self, command: Emitted) -> str:
        """The lease scope of a command (``<environment>/<name>``), before running it."""
        return from_record(command.type, self.serde.deserialize(command.payload).value).resource

    def executed(self, command: Emitted, fencing_token: int) -> Emitted:
        """The executor: the command's authorization, the sim's action under the fencing
        token, RecoveryExecuted."""
        value = self._receive(command)
        verify_command(self._authorities, command.type, value)
        step = from_record(command.type, value)
        if step.expired(datetime.now(UTC)):
            raise ChainBroken(f"{step.command_id} expired before it ran")
        started = time.monotonic()
        result = self.target.apply(
            step.action, step.resource, step.params, step.idempotency_key, fencing_token, "dbos-baseline"
        )
        applied = Applied(step, fencing_token, result.before, result.after, round(1000 * (time.monotonic() - started)))
        return self._caused(fleet.EXECUTOR.name, recovery_executed(applied, datetime.now(UTC)), command)
