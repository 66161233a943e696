"""The web console: approvals with their context, incident timelines, the DLQ, for people.

``python -m services.console`` serves it (``FLOTILLA_HTTP_PORT``, default 18108). It has
no database and no Kafka consumer: every page is built from the services' HTTP APIs
through :class:`flotilla_ops.fleetapi.FleetApi`.
"""

from services.console.app import create_console_app

__all__ = ["create_console_app"]
