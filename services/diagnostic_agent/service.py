"""The diagnostic agent as a fleet member: its ServiceSpec."""

from __future__ import annotations

from pathlib import Path

from flotilla_evidence import EvidenceSource
from flotilla_reasoning import Reasoner, failures, make_reasoner

from flotilla import DEFERRED_WORK_MIGRATION, Periodic, ServiceContext, ServiceSpec, fleet
from services.diagnostic_agent.handlers import STILL_DIAGNOSING, DiagnosticAgent
from services.diagnostic_agent.settings import DiagnosticSettings

MIGRATIONS = (Path(__file__).with_name("migrations.sql").read_text(), failures.MIGRATION, DEFERRED_WORK_MIGRATION)


def build_agent(
    settings: DiagnosticSettings | None = None,
    *,
    reasoner: Reasoner | None = None,
    evidence: EvidenceSource | None = None,
) -> tuple[ServiceSpec, DiagnosticAgent]:
    """The spec and the agent behind it (tests inject a reasoner or an evidence source)."""
    settings = settings or DiagnosticSettings.load()
    agent = DiagnosticAgent(
        settings,
        reasoner or make_reasoner(settings),
        evidence or settings.workload_evidence(),
    )

    def finish_due_jobs(ctx: ServiceContext) -> None:
        agent.finish_due_jobs(ctx)

    def learn_baselines(ctx: ServiceContext) -> None:
        agent.learn_baselines(ctx)

    periodic: list[Periodic] = [(settings.diagnostic_job_poll_seconds, finish_due_jobs)]
    periodic.extend(agent.worker.periodic(settings.diagnose_workers))
    if settings.baseline_seconds > 0:
        periodic.append((settings.baseline_seconds, learn_baselines))
    spec = ServiceSpec(
        name=fleet.DIAGNOSTIC.name,
        database=settings.service_database,
        topics=("incidents",),
        handlers=agent.handlers,
        migrations=MIGRATIONS,
        periodic=tuple(periodic),
        # The agent that spends an incident's LLM tokens also enforces its budgets
        # (tokens, wall time, steps): one owner, so one BudgetExceeded per incident.
        loop={"budgets": settings.budgets()},
        observes=(STILL_DIAGNOSING,),
    )
    return spec, agent


def build_spec(settings: DiagnosticSettings | None = None) -> ServiceSpec:
    """The ServiceSpec alone, as ``__main__`` runs it."""
    return build_agent(settings)[0]
