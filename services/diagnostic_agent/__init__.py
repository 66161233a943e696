"""The diagnostic agent: DiagnosisRequested → DependencyFailureSuspected / DiagnosisConcluded,
directly or through a durable slow diagnostic job."""

from services.diagnostic_agent.handlers import DiagnosticAgent
from services.diagnostic_agent.service import build_agent, build_spec
from services.diagnostic_agent.settings import DiagnosticSettings

__all__ = ["DiagnosticAgent", "DiagnosticSettings", "build_agent", "build_spec"]
