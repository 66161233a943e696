"""``python -m services.remediation_agent``: run the remediation agent until SIGTERM."""

from __future__ import annotations

from flotilla.runner import start
from services.remediation_agent.service import build_spec
from services.remediation_agent.settings import RemediationSettings


def main() -> None:
    settings = RemediationSettings.load()
    spec, _ = build_spec(settings)
    start(spec, settings)


if __name__ == "__main__":
    main()
