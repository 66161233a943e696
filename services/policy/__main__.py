"""``python -m services.policy``: run the policy service until SIGTERM."""

from __future__ import annotations

from flotilla import runner
from flotilla.fleet import POLICY
from services.policy.runtime import PolicyRuntime
from services.policy.service import DATABASE, build_spec
from services.policy.settings import PolicySettings


def main() -> None:
    settings = PolicySettings.load(service_name=POLICY.name, service_database=DATABASE)
    runner.start(build_spec(PolicyRuntime.from_settings(settings)), settings)


if __name__ == "__main__":
    main()
