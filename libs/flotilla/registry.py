"""The schema registry client: one way to reach the Confluent-compatible API.

Its own module so that the catalogue (``contracts``) and the serde can both use it
without either importing the other.
"""

from __future__ import annotations

from confluent_kafka.schema_registry import SchemaRegistryClient

__all__ = ["registry_client"]


def registry_client(url: str) -> SchemaRegistryClient:
    """A registry client for the Confluent-compatible API at ``url``."""
    return SchemaRegistryClient({"url": url})
