"""The remediation agent: a diagnosis → RecoveryProposed (exact, keyed, digested commands)."""

from services.remediation_agent.handlers import RemediationAgent
from services.remediation_agent.service import build_agent, build_spec
from services.remediation_agent.settings import RemediationSettings

__all__ = ["RemediationAgent", "RemediationSettings", "build_agent", "build_spec"]
