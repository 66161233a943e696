"""Every Kafka client of the fleet connects with one configuration: plaintext locally,
TLS and/or SASL on a real cluster, from FLOTILLA_KAFKA_* settings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flotilla.consumer import ConsumerLoop, LoopConfig
from flotilla.settings import StackSettings, kafka_connection


def settings(**env: str) -> StackSettings:
    return StackSettings(_env_file=None, **env)  # type: ignore[call-arg, arg-type]


def test_plaintext_is_the_bootstrap_address_alone() -> None:
    assert settings(kafka_bootstrap="k:9092").kafka_client() == {"bootstrap.servers": "k:9092"}


def test_sasl_ssl_with_scram_and_a_ca() -> None:
    conf = settings(
        kafka_bootstrap="kafka.example:9093",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="flotilla",
        kafka_sasl_password="s3cret",
        kafka_ssl_ca_location="/etc/kafka/ca.crt",
    ).kafka_client()
    assert conf == {
        "bootstrap.servers": "kafka.example:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "flotilla",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/kafka/ca.crt",
    }


def test_tls_without_sasl_carries_no_credentials() -> None:
    conf = settings(kafka_security_protocol="SSL", kafka_ssl_ca_location="/ca.pem").kafka_client()
    assert conf["security.protocol"] == "ssl" and conf["ssl.ca.location"] == "/ca.pem"
    assert not any(k.startswith("sasl.") for k in conf)


def test_sasl_without_credentials_is_refused_naming_what_is_missing() -> None:
    with pytest.raises(ValidationError) as refused:
        settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN")
    message = str(refused.value)
    assert "FLOTILLA_KAFKA_SASL_USERNAME" in message and "FLOTILLA_KAFKA_SASL_PASSWORD" in message
    assert "MECHANISM" not in message


def test_an_unknown_protocol_is_refused() -> None:
    with pytest.raises(ValidationError):
        settings(kafka_security_protocol="KERBEROS")


def test_a_bare_address_and_a_configuration_are_both_targets() -> None:
    assert kafka_connection("h:1") == {"bootstrap.servers": "h:1"}
    assert kafka_connection({"bootstrap.servers": "h:1", "security.protocol": "ssl"})["security.protocol"] == "ssl"


def test_the_consumer_loop_connects_with_the_security_settings() -> None:
    secured = settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-256",
        kafka_sasl_username="u",
        kafka_sasl_password="p",
    )
    # librdkafka clients connect lazily: building the loop contacts no broker
    loop = ConsumerLoop(
        LoopConfig(name="g", topics=("incidents",), source="/t", stats_interval_ms=0),
        secured,
        serde=None,  # type: ignore[arg-type]
        pool=None,  # type: ignore[arg-type]
        handlers={},
    )
    conf = loop.kafka_config()
    assert conf["security.protocol"] == "sasl_plaintext" and conf["sasl.username"] == "u"
    assert conf["group.id"] == "g"
