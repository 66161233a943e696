"""The pluggable reasoner both agents decide through.

``rules`` (the default) is deterministic and offline; ``llm`` asks any OpenAI-compatible
chat-completions server for a structured answer and validates it. ``make_reasoner``
picks one from the settings (``FLOTILLA_REASONER``).
"""

from flotilla_reasoning.base import Reasoner, ReasoningFailed
from flotilla_reasoning.llm import LLMReasoner
from flotilla_reasoning.model import (
    Action,
    Diagnosis,
    DiagnosticEvidence,
    EvidenceItem,
    PlannedStep,
    Proposal,
    Reasoning,
    ServiceView,
    TokenUsage,
    Topology,
    Verdict,
)
from flotilla_reasoning.rules import RulesConfig, RulesReasoner
from flotilla_reasoning.settings import AgentSettings


def make_reasoner(settings: AgentSettings) -> Reasoner:
    """The reasoner ``FLOTILLA_REASONER`` names (rules unless it says llm)."""
    if settings.reasoner == "llm":
        return LLMReasoner.from_settings(settings)
    return RulesReasoner(RulesConfig.from_settings(settings))


__all__ = [
    "Action",
    "AgentSettings",
    "Diagnosis",
    "DiagnosticEvidence",
    "EvidenceItem",
    "LLMReasoner",
    "PlannedStep",
    "Proposal",
    "Reasoner",
    "Reasoning",
    "ReasoningFailed",
    "RulesConfig",
    "RulesReasoner",
    "ServiceView",
    "TokenUsage",
    "Topology",
    "Verdict",
    "make_reasoner",
]
