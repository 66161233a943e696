"""``python -m services.dlq_reconciler``"""

from __future__ import annotations

from flotilla.runner import start
from services.dlq_reconciler.service import build_spec
from services.dlq_reconciler.settings import load_settings


def main() -> None:
    settings = load_settings()
    start(build_spec(settings), settings)


if __name__ == "__main__":
    main()
