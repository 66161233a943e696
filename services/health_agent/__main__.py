"""python -m services.health_agent: the member as the fleet runs it (flotilla.runner.run_service)."""

from flotilla import run_service
from services.health_agent.service import build_spec
from services.health_agent.settings import HealthSettings

if __name__ == "__main__":
    run_service(build_spec, HealthSettings)
