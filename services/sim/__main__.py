"""``python -m services.sim``: serve the default topology until SIGTERM/SIGINT."""

from __future__ import annotations

from flotilla import run_app
from services.sim.app import build_app
from services.sim.settings import SimSettings

if __name__ == "__main__":
    # no access log: the health agent scrapes often
    run_app(build_app, SimSettings, address=lambda s: (s.sim_host, s.sim_port), access_log=False)
