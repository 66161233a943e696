"""python -m services.dlq_reconciler: the member as the fleet runs it (flotilla.runner.run_service)."""

from flotilla import run_service
from services.dlq_reconciler.service import build_spec
from services.dlq_reconciler.settings import DlqSettings

if __name__ == "__main__":
    run_service(build_spec, DlqSettings)
