"""The remediation agent as a fleet member: its ServiceSpec."""

from __future__ import annotations

from pathlib import Path

from flotilla_evidence import EvidenceSource
from flotilla_reasoning import Reasoner, failures, make_reasoner

from flotilla import DEFERRED_WORK_MIGRATION, ServiceSpec, fleet
from services.remediation_agent.handlers import OBSERVES, RemediationAgent
from services.remediation_agent.settings import RemediationSettings

MIGRATIONS = (Path(__file__).with_name("migrations.sql").read_text(), failures.MIGRATION, DEFERRED_WORK_MIGRATION)


def build_agent(
    settings: RemediationSettings | None = None,
    *,
    reasoner: Reasoner | None = None,
    evidence: EvidenceSource | None = None,
) -> tuple[ServiceSpec, RemediationAgent]:
    """The spec and the agent behind it (tests inject a reasoner or an evidence source)."""
    settings = settings or RemediationSettings.load()
    agent = RemediationAgent(
        settings,
        reasoner or make_reasoner(settings),
        evidence or settings.evidence(),
        settings.proposal_signer(),
    )
    spec = ServiceSpec(
        name=fleet.REMEDIATION.name,
        database=settings.service_database,
        topics=("incidents",),
        handlers=agent.handlers,
        migrations=MIGRATIONS,
        periodic=agent.worker.periodic(settings.propose_workers),
        observes=OBSERVES,
    )
    return spec, agent


def build_spec(settings: RemediationSettings | None = None) -> ServiceSpec:
    """The ServiceSpec alone, as ``__main__`` runs it."""
    return build_agent(settings)[0]
