"""``python -m services.console``: serve the console until SIGTERM/SIGINT.

Like the sim, uvicorn stops gracefully on the signal and re-raises it.
"""

from __future__ import annotations

import logging

import uvicorn

from services.console.app import create_console_app
from services.console.settings import ConsoleSettings


def main() -> None:
    settings = ConsoleSettings.load()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s console %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per service call is noise
    app = create_console_app(settings)
    uvicorn.run(app, host=settings.http_host, port=settings.http_port, log_level=settings.log_level.lower())


if __name__ == "__main__":
    main()
