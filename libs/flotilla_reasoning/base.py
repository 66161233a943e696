"""The reasoner interface both agents decide through, and its one failure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from flotilla_reasoning.model import Diagnosis, DiagnosticEvidence, Proposal, TokenUsage, Topology


class ReasoningFailed(Exception):
    """No acceptable decision: the agent escalates the incident to a person.

    ``usage`` is what the attempts cost (it is charged to the incident all the same);
    ``problems`` says what was wrong with the last answer. Neither the bad answer nor
    the problems go on a topic: the agent keeps them in its own database.
    """

    def __init__(
        self,
        reason: str,
        *,
        reasoner: str,
        usage: TokenUsage | None = None,
        attempts: int = 0,
        problems: Sequence[str] = (),
        last_answer: str | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.reasoner = reasoner
        self.usage = usage or TokenUsage()
        self.attempts = attempts
        self.problems = tuple(problems)
        self.last_answer = last_answer


class Reasoner(Protocol):
    """Turns evidence into a diagnosis and a diagnosis into a recovery plan.

    Implementations are deterministic (``rules``) or ask a model (``llm``); either way
    what they return is a recommendation, validated before any record is built from it.
    Both raise :class:`ReasoningFailed` when they cannot decide.
    """

    name: str

    def diagnose(self, evidence: DiagnosticEvidence) -> Diagnosis: ...

    def propose(self, diagnosis: Diagnosis, topology: Topology) -> Proposal: ...
