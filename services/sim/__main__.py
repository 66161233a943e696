"""``python -m services.sim``: serve the default topology until SIGTERM/SIGINT.

uvicorn shuts down gracefully on the signal and then re-raises it, so the process ends
"killed by SIGTERM" (exit status -15 / 143) after a clean stop, as uvicorn apps do.

Without ``FLOTILLA_SIM_ACTION_TOKEN`` the sim refuses to start (exit status 1): a sim
the executor cannot act on is a misconfiguration, better reported when it is deployed
than as a failed command during the first incident.
"""

from __future__ import annotations

import logging
import sys

import uvicorn

from services.sim.app import create_sim_app
from services.sim.settings import SimSettings

MISSING_TOKEN = (
    "sim: FLOTILLA_SIM_ACTION_TOKEN is not set; the sim does not serve actions without the token the executor "
    "presents (the executor's setting of the same name). The local fleet generates one "
    "(.stack/secrets/sim-action-token); docker compose and Kubernetes take it from .env or a Secret."
)


def main() -> None:
    settings = SimSettings.load()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s sim %(name)s %(message)s")
    if settings.sim_action_token is None:
        sys.exit(MISSING_TOKEN)
    app = create_sim_app(
        action_token=settings.sim_action_token.get_secret_value(), action_seconds=settings.sim_action_seconds
    )
    # lifecycle lines at INFO, but no line per request: the health agent scrapes often
    uvicorn.run(
        app, host=settings.sim_host, port=settings.sim_port, log_level=settings.log_level.lower(), access_log=False
    )


if __name__ == "__main__":
    main()
