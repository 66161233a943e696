"""Fixtures of the CLI's unit tests (the stand-ins themselves are in fakes.py)."""

from __future__ import annotations

import httpx
import pytest
from confluent_kafka.schema_registry._sync.mock_schema_registry_client import MockSchemaRegistryClient
from flotilla_ops.cli import Runtime
from flotilla_ops.fleetapi import FleetApi, FleetEndpoints
from typer.testing import CliRunner

from flotilla.contracts import register_all
from flotilla.serde import AvroSerde
from flotilla.settings import StackSettings

from .fakes import FakeProducer, Services


@pytest.fixture(scope="session")
def registry() -> MockSchemaRegistryClient:
    client = MockSchemaRegistryClient({"url": "mock://registry"})
    register_all(client)
    return client


@pytest.fixture
def serde(registry: MockSchemaRegistryClient) -> AvroSerde:
    return AvroSerde(registry)


@pytest.fixture
def producer() -> FakeProducer:
    return FakeProducer()


@pytest.fixture
def cli() -> CliRunner:
    return CliRunner()


@pytest.fixture
def kafka_runtime(serde: AvroSerde, producer: FakeProducer) -> Runtime:
    return Runtime(
        settings_factory=StackSettings,
        serde_factory=lambda _settings: serde,
        producer_factory=lambda _settings: producer,
    )


@pytest.fixture
def services() -> Services:
    return Services()


@pytest.fixture
def http_runtime(services: Services) -> Runtime:
    return Runtime(
        settings_factory=StackSettings,
        api_factory=lambda _timeout: FleetApi(FleetEndpoints(), transport=httpx.MockTransport(services.handle)),
    )
