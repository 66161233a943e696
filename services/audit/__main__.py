"""python -m services.audit: the member as the fleet runs it (flotilla.runner.run_service)."""

from flotilla import run_service
from services.audit.service import build_spec
from services.audit.settings import AuditSettings

if __name__ == "__main__":
    run_service(build_spec, AuditSettings)
