"""``python -m services.executor``: run the executor until SIGTERM."""

from __future__ import annotations

from flotilla.runner import start
from services.executor.service import spec
from services.executor.settings import ExecutorSettings

if __name__ == "__main__":
    start(spec(), ExecutorSettings.load())
