"""python -m services.remediation_agent: the member as the fleet runs it (flotilla.runner.run_service)."""

from flotilla import run_service
from services.remediation_agent.service import build_spec
from services.remediation_agent.settings import RemediationSettings

if __name__ == "__main__":
    run_service(build_spec, RemediationSettings)
