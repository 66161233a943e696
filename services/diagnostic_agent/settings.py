"""The diagnostic agent's settings (``FLOTILLA_*``; see also AgentSettings)."""

from __future__ import annotations

from datetime import timedelta

from flotilla_reasoning.settings import AgentSettings
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from flotilla import Budgets, fleet


class DiagnosticSettings(AgentSettings):
    model_config = SettingsConfigDict(env_prefix="FLOTILLA_", extra="ignore")

    service_name: str = fleet.DIAGNOSTIC.name
    service_database: str = fleet.DIAGNOSTIC.database or "flotilla_diagnostic"
    http_port: int = fleet.DIAGNOSTIC.http_port

    # > 0: every diagnosis runs as a slow job that finishes this many seconds later.
    diagnostic_job_seconds: float = Field(0.0, ge=0)
    # How long after its due time a job may still wait for evidence before escalating.
    # The job run when the reasoner asks for more evidence (when no FLOTILLA_DIAGNOSTIC_JOB_SECONDS).
    diagnostic_evidence_job_seconds: float = Field(10.0, gt=0)
    diagnostic_job_deadline_seconds: float = Field(300.0, gt=0)
    diagnostic_job_poll_seconds: float = Field(1.0, gt=0)  # how often due jobs are looked for
    diagnostic_job_retry_seconds: float = Field(5.0, gt=0)  # a job that could not finish tries again after
    # Diagnoses run outside the consumer's transaction (flotilla.deferred) on this many
    # threads, each owning its request (and a job its evidence) this long past its last
    # heartbeat: renewed every third of it while the evidence or model answers, however slowly.
    diagnose_workers: int = Field(4, ge=1, le=32)
    diagnose_lease_seconds: float = Field(30.0, gt=0)
    # How often healthy latencies are sampled into baselines ("normal"); 0 turns it off.
    baseline_seconds: float = Field(5.0, ge=0)
    baseline_weight: float = Field(0.2, gt=0, le=1)  # EWMA weight of a new sample

    # Per-incident budgets this agent enforces; exceeding one escalates the incident.
    budget_llm_tokens: int = Field(50_000, gt=0)  # FLOTILLA_BUDGET_LLM_TOKENS
    budget_wall_seconds: float = Field(4 * 3600, gt=0)  # FLOTILLA_BUDGET_WALL_SECONDS
    budget_steps: int = Field(40, gt=0)  # FLOTILLA_BUDGET_STEPS

    def budgets(self) -> Budgets:
        return Budgets(
            llm_tokens=self.budget_llm_tokens,
            wall_time=timedelta(seconds=self.budget_wall_seconds),
            steps=self.budget_steps,
        )
