"""What commands need from outside: stack settings, the serde, Kafka clients, the fleet API.

Commands never construct these themselves; they ask the :class:`Runtime` found on the
click context (``ctx.obj``). Tests pass their own (``CliRunner().invoke(app, args,
obj=Runtime(...))``) to observe a producer or stand in for a service.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import typer
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from flotilla.registry import registry_client
from flotilla.serde import AvroSerde
from flotilla.settings import KafkaTarget, StackSettings, kafka_connection, load_settings, project_path
from flotilla.tailing import tail_consumer
from flotilla_ops.fleetapi import FleetApi


class ProducerLike(Protocol):
    def produce(self, topic: str, **kwargs: Any) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...


class ConsumerLike(Protocol):
    def poll(self, timeout: float = ...) -> Any: ...

    def close(self) -> None: ...


def producer_config(bootstrap: KafkaTarget) -> dict[str, Any]:
    """Acknowledged by every in-sync replica, idempotent, and keyed like Debezium (a Java
    client: murmur2), so a CLI record lands in its incident's partition, in order."""
    return {
        **kafka_connection(bootstrap),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "partitioner": "murmur2_random",
    }


def kafka_consumer(
    bootstrap: KafkaTarget, topics: Sequence[str], *, from_beginning: bool = False, since_ms: int | None = None
) -> Consumer:
    """A reader of ``topics`` from their end (the tailing library), their beginning, or a time."""
    consumer = tail_consumer(bootstrap, list(topics))
    missing = sorted(set(topics) - {tp.topic for tp in consumer.assignment()})
    if missing:
        consumer.close()
        raise LookupError(f"no such topic: {', '.join(missing)}")
    if from_beginning:
        consumer.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in consumer.assignment()])
    elif since_ms is not None:
        wanted = [TopicPartition(tp.topic, tp.partition, since_ms) for tp in consumer.assignment()]
        found = consumer.offsets_for_times(wanted, timeout=10)
        # a partition with nothing that recent answers -1: keep its end offset
        ends = {(tp.topic, tp.partition): tp.offset for tp in consumer.assignment()}
        consumer.assign(
            [
                TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else ends[(tp.topic, tp.partition)])
                for tp in found
            ]
        )
    return consumer


@dataclass
class Runtime:
    """Factories, each replaceable; the defaults reach the configured stack and fleet."""

    settings_factory: Callable[[], StackSettings] = load_settings
    serde_factory: Callable[[StackSettings], AvroSerde] | None = None
    producer_factory: Callable[[StackSettings], ProducerLike] | None = None
    consumer_factory: Callable[..., ConsumerLike] | None = None
    api_factory: Callable[[float], FleetApi] = field(default=lambda timeout: FleetApi(timeout=timeout))
    http_timeout: float = 10.0
    repo_root: Path | None = None  # the checkout the stack commands run in (found from the cwd when None)
    _settings: StackSettings | None = field(default=None, init=False, repr=False)
    _serde: AvroSerde | None = field(default=None, init=False, repr=False)

    @property
    def project_root(self) -> Path:
        """The checkout whose ``infra/local`` scripts the stack commands run."""
        return self.repo_root or project_path("FLOTILLA_PROJECT_DIR", "infra/local").parents[1]

    @property
    def settings(self) -> StackSettings:
        if self._settings is None:
            self._settings = self.settings_factory()
        return self._settings

    def serde(self) -> AvroSerde:
        if self._serde is None:
            if self.serde_factory is not None:
                self._serde = self.serde_factory(self.settings)
            else:
                self._serde = AvroSerde(registry_client(self.settings.schema_registry_url))
        return self._serde

    def producer(self) -> ProducerLike:
        if self.producer_factory is not None:
            return self.producer_factory(self.settings)
        made: Any = Producer(producer_config(self.settings.kafka_client()))
        return cast(ProducerLike, made)

    def consumer(self, topics: Sequence[str], *, from_beginning: bool, since_ms: int | None) -> ConsumerLike:
        if self.consumer_factory is not None:
            made: ConsumerLike = self.consumer_factory(topics, from_beginning=from_beginning, since_ms=since_ms)
            return made
        return kafka_consumer(self.settings.kafka_client(), topics, from_beginning=from_beginning, since_ms=since_ms)

    def api(self, timeout: float | None = None) -> FleetApi:
        """The fleet's HTTP client; ``timeout`` for a call known to be slow (else ``http_timeout``)."""
        return self.api_factory(timeout if timeout is not None else self.http_timeout)


def runtime(ctx: typer.Context) -> Runtime:
    """The runtime on the context (the root callback puts a default one there)."""
    found = ctx.find_object(Runtime)
    if found is None:
        found = Runtime()
        ctx.obj = found
    return found
