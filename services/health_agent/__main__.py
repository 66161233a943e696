"""``python -m services.health_agent``"""

from __future__ import annotations

from flotilla.runner import start
from services.health_agent.service import build_spec
from services.health_agent.settings import load_settings


def main() -> None:
    settings = load_settings()
    start(build_spec(settings), settings)


if __name__ == "__main__":
    main()
