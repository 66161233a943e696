"""What a reasoner reads and what it returns, as plain immutable values.

The agents turn these into Avro records; the reasoners never see a record or a topic.
A :class:`Reasoning` is the justification every decision carries (the contract's
``Reasoning`` record); a :class:`Diagnosis` and a :class:`Proposal` are decisions, not
facts: nothing here is authorized to act.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from flotilla_evidence.model import RevisionFacts, ServiceView, Topology

from flotilla import records
from flotilla.actions import Action

__all__ = [
    "CAUSE_CATEGORIES",
    "Action",
    "Diagnosis",
    "DiagnosticEvidence",
    "EvidenceItem",
    "PlannedStep",
    "Proposal",
    "Reasoning",
    "ServiceView",
    "TokenUsage",
    "Topology",
    "Verdict",
    "rollback_params",
]


@dataclass(frozen=True)
class TokenUsage:
    """Model tokens one decision consumed, summed over retries (zeros for rules)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)

    def to_record(self) -> records.TokenUsage:
        return records.TokenUsage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)


@dataclass(frozen=True)
class EvidenceItem:
    """One observation a decision rests on (the contract's ``Evidence`` record)."""

    kind: str
    source: str
    description: str
    observed_value: str | None = None

    def to_record(self) -> records.Evidence:
        return records.Evidence(
            kind=self.kind, source=self.source, description=self.description, observed_value=self.observed_value
        )

    @classmethod
    def from_record(cls, record: records.Evidence) -> EvidenceItem:
        return cls(record.kind, record.source, record.description, record.observed_value)


@dataclass(frozen=True)
class Reasoning:
    """Why a reasoner decided what it decided, and what it cost."""

    summary: str
    evidence: tuple[EvidenceItem, ...]
    confidence: float
    reasoner: str  # "rules" or "llm"
    model: str | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)

    def to_record(self) -> records.Reasoning:
        return records.Reasoning(
            summary=self.summary,
            evidence=tuple(e.to_record() for e in self.evidence),
            confidence=float(self.confidence),
            reasoner=self.reasoner,
            model=self.model,
            token_usage=self.usage.to_record(),
        )

    @classmethod
    def from_record(cls, record: records.Reasoning) -> Reasoning:
        usage = record.token_usage
        return cls(
            summary=record.summary,
            evidence=tuple(EvidenceItem.from_record(e) for e in record.evidence),
            confidence=record.confidence,
            reasoner=record.reasoner,
            model=record.model,
            usage=TokenUsage(usage.prompt_tokens, usage.completion_tokens),
        )


# ----------------------------------------------------------------- the world
# What is known about the estate is the evidence source's (flotilla_evidence), whatever
# the source: the reasoners read it and never learn where it came from.


# ------------------------------------------------------------- what goes in


@dataclass(frozen=True)
class DiagnosticEvidence:
    """What the diagnostic agent knows when it asks for a diagnosis."""

    incident_id: str
    service: str
    environment: str
    symptom: str
    topology: Topology
    job_id: str | None = None  # the slow job whose result this is, if any
    job_kind: str | None = None
    # False once a slow job already ran: the reasoner must decide with what it has.
    may_request_more: bool = True
    # When the incident asked for this diagnosis (None: not known). Evidence that shows no
    # breach since then has not caught up with the detection yet (a scrape or rate window
    # behind the reading that opened the incident): the rules reasoner reads it again.
    requested_at: datetime | None = None


# ----------------------------------------------------------- what comes out


class Verdict(enum.StrEnum):
    DEPENDENCY_FAILURE = "dependency-failure"  # -> DependencyFailureSuspected
    CONCLUDED = "concluded"  # -> DiagnosisConcluded
    NEEDS_EVIDENCE = "needs-evidence"  # -> DiagnosticJobStarted, decide later


CAUSE_CATEGORIES = ("capacity", "bad-deployment", "configuration", "external", "unknown")


@dataclass(frozen=True)
class Diagnosis:
    """A diagnosis: a suspected dependency, another conclusion, or a request for more evidence."""

    verdict: Verdict
    incident_id: str
    service: str
    reasoning: Reasoning
    suspected_dependency: str | None = None
    failure_mode: str | None = None
    cause_category: str | None = None
    job_kind: str | None = None  # NEEDS_EVIDENCE: which slow job to run
    event_id: str | None = None  # the record's eventId, once it is one
    environment: str | None = None  # the service's (None from a record older than the field)


def rollback_params(running: RevisionFacts, candidate: RevisionFacts) -> dict[str, Any]:
    """A rollback step's params from the evidence: back from the running revision to the
    candidate, each named by its revision, pod-template hash and images."""
    return {
        "toRevision": candidate.revision,
        "fromRevision": running.revision,
        "fromTemplateHash": running.template_hash,
        "toTemplateHash": candidate.template_hash,
        "fromImages": list(running.images),
        "toImages": list(candidate.images),
    }


@dataclass(frozen=True)
class PlannedStep:
    """One step of a plan: an action on a service with its parameters.

    ``params`` holds the command's own fields (:mod:`flotilla.actions` names each kind's);
    facts a reasoner does not choose (a rollback's hashes and images) may be absent and are
    filled from the evidence by the agent.
    """

    action: Action
    service: str
    environment: str
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Proposal:
    """A recovery plan: steps run in order as a saga, with why."""

    incident_id: str
    diagnosis_event_id: str
    steps: tuple[PlannedStep, ...]
    reasoning: Reasoning
