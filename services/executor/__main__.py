"""python -m services.executor: the member as the fleet runs it (flotilla.runner.run_service)."""

from flotilla import run_service
from services.executor.service import build_spec
from services.executor.settings import ExecutorSettings

if __name__ == "__main__":
    run_service(build_spec, ExecutorSettings)
