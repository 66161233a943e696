"""``python -m services.console``: serve the console until SIGTERM/SIGINT."""

from __future__ import annotations

from flotilla import run_app
from services.console.app import build_app
from services.console.settings import ConsoleSettings

if __name__ == "__main__":
    run_app(build_app, ConsoleSettings)
