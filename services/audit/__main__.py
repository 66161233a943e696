"""``python -m services.audit``"""

from __future__ import annotations

from flotilla.runner import start
from services.audit.service import build_spec
from services.audit.settings import load_settings


def main() -> None:
    settings = load_settings()
    start(build_spec(settings), settings)


if __name__ == "__main__":
    main()
