"""``python -m services.diagnostic_agent``: run the diagnostic agent until SIGTERM."""

from __future__ import annotations

from flotilla.runner import start
from services.diagnostic_agent.service import build_spec
from services.diagnostic_agent.settings import DiagnosticSettings


def main() -> None:
    settings = DiagnosticSettings.load()
    spec, _ = build_spec(settings)
    start(spec, settings)


if __name__ == "__main__":
    main()
