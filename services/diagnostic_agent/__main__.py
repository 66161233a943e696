"""python -m services.diagnostic_agent: the member as the fleet runs it (flotilla.runner.run_service)."""

from flotilla import run_service
from services.diagnostic_agent.service import build_spec
from services.diagnostic_agent.settings import DiagnosticSettings

if __name__ == "__main__":
    run_service(build_spec, DiagnosticSettings)
