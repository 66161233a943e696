"""``python -m services.sim``: serve the default topology until SIGTERM/SIGINT.

uvicorn shuts down gracefully on the signal and then re-raises it, so the process ends
"killed by SIGTERM" (exit status -15 / 143) after a clean stop, as uvicorn apps do.
"""

from __future__ import annotations

import logging

import uvicorn

from services.sim.app import create_sim_app
from services.sim.settings import SimSettings


def main() -> None:
    settings = SimSettings.load()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s sim %(name)s %(message)s")
    app = create_sim_app(action_seconds=settings.sim_action_seconds)
    # lifecycle lines at INFO, but no line per request: the health agent scrapes often
    uvicorn.run(
        app, host=settings.sim_host, port=settings.sim_port, log_level=settings.log_level.lower(), access_log=False
    )


if __name__ == "__main__":
    main()
