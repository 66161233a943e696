"""python -m services.policy: the member as the fleet runs it (flotilla.runner.run_service)."""

from flotilla import run_service
from services.policy.service import build_spec
from services.policy.settings import PolicySettings

if __name__ == "__main__":
    run_service(build_spec, PolicySettings)
