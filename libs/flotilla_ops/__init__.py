"""Operator surfaces of Flotilla: the fleet's HTTP client, the ``flotilla`` CLI.

The runtime library (``flotilla``) is what services are built from; this package is
what people use to drive a running fleet. Both the CLI and the web console talk to
the services through :mod:`flotilla_ops.fleetapi`, never to their databases.
"""

from flotilla_ops.fleetapi import FleetApi, FleetApiError, FleetEndpoints

__all__ = ["FleetApi", "FleetApiError", "FleetEndpoints"]
