"""The Kubernetes Connect worker's config as Kafka's own code reads it (review 3, M4).

``infra/k8s/base/connect/kafkaconnect.yaml`` limits the env config provider with
``allowlist.pattern`` and turns connector client overrides off. Here those two values go
through Kafka Connect 4.3's classes from the local stack's distribution (a short Java
program, ``java`` running its source): the provider resolves a connector config the way a
worker does, and the override policy judges a connector that asks for another bootstrap
server and another login. No worker is started, nothing of the running stack is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_CONNECT = REPO_ROOT / "infra" / "k8s" / "base" / "connect" / "kafkaconnect.yaml"
LIBS = Path(os.environ.get("FLOTILLA_STACK_HOME", REPO_ROOT / ".stack")) / "dist" / "kafka" / "libs"

# What a connector might name: the four the outbox connectors use, and what else a Strimzi
# worker's environment holds.
ENVIRONMENT = (
    "FLOTILLA_PG_HOST",
    "FLOTILLA_PG_PORT",
    "FLOTILLA_PG_USER",
    "FLOTILLA_PG_PASSWORD",
    "FLOTILLA_PG_PASSWORDX",
    "KAFKA_CONNECT_SASL_PASSWORD_FILE",
    "KAFKA_CONNECT_CONFIGURATION",
    "HOME",
)
NEEDED = {"FLOTILLA_PG_HOST", "FLOTILLA_PG_PORT", "FLOTILLA_PG_USER", "FLOTILLA_PG_PASSWORD"}

PROBE = """
import java.util.*;
import org.apache.kafka.common.config.ConfigTransformer;
import org.apache.kafka.common.config.ConfigValue;
import org.apache.kafka.common.config.provider.ConfigProvider;
import org.apache.kafka.connect.connector.policy.ConnectorClientConfigOverridePolicy;
import org.apache.kafka.connect.connector.policy.ConnectorClientConfigRequest;
import org.apache.kafka.connect.health.ConnectorType;

public class Probe {
    public static void main(String[] args) throws Exception {
        // args: provider class, allowlist pattern, override policy alias, variable names...
        Map<String, String> env = new HashMap<>();
        for (int i = 3; i < args.length; i++) env.put(args[i], "value-of-" + args[i]);
        ConfigProvider provider = (ConfigProvider) Class.forName(args[0])
            .getDeclaredConstructor(Map.class).newInstance(env);
        provider.configure(Map.of("allowlist.pattern", args[1]));
        ConfigTransformer transformer = new ConfigTransformer(Map.of("env", provider));
        Map<String, String> config = new TreeMap<>();
        for (String name : env.keySet()) config.put(name, "${env:" + name + "}");
        for (Map.Entry<String, String> e : new TreeMap<>(transformer.transform(config).data()).entrySet())
            System.out.println("env\\t" + e.getKey() + "\\t" + e.getValue());
        // Connect resolves an alias by the class's simple name without this suffix.
        String policyClass = "org.apache.kafka.connect.connector.policy." + args[2];
        ConnectorClientConfigOverridePolicy policy = (ConnectorClientConfigOverridePolicy)
            Class.forName(policyClass + "ConnectorClientConfigOverridePolicy").getDeclaredConstructor().newInstance();
        List<ConfigValue> verdicts = policy.validate(new ConnectorClientConfigRequest("outbox-x", ConnectorType.SOURCE,
            null, Map.of("bootstrap.servers", "elsewhere:9092", "sasl.jaas.config", "another login"),
            ConnectorClientConfigRequest.ClientType.PRODUCER));
        for (ConfigValue v : verdicts) System.out.println("override\\t" + v.name() + "\\t" + v.errorMessages().size());
    }
}
"""


def _worker_config() -> dict[str, str]:
    (connect,) = [d for d in yaml.safe_load_all(KAFKA_CONNECT.read_text()) if d and d["kind"] == "KafkaConnect"]
    return {k: str(v) for k, v in connect["spec"]["config"].items()}


def test_the_worker_resolves_only_what_the_connectors_need_and_refuses_client_overrides(tmp_path: Path) -> None:
    if shutil.which("java") is None or not list(LIBS.glob("connect-runtime-*.jar")):
        pytest.skip(f"needs java and Kafka's jars in {LIBS} (make stack-up fetches them)")
    config = _worker_config()
    provider = config[f"config.providers.{config['config.providers']}.class"]
    pattern = config["config.providers.env.param.allowlist.pattern"]
    policy = config["connector.client.config.override.policy"]
    (tmp_path / "Probe.java").write_text(PROBE)
    done = subprocess.run(
        ["java", "-cp", f"{LIBS}/*", str(tmp_path / "Probe.java"), provider, pattern, policy, *ENVIRONMENT],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [line.split("\t") for line in done.stdout.splitlines() if "\t" in line]
    resolved = {name: value for kind, name, value in lines if kind == "env"}
    assert resolved.keys() == set(ENVIRONMENT)
    for name, value in resolved.items():
        expected = f"value-of-{name}" if name in NEEDED else f"${{env:{name}}}"  # left as written: not read
        assert value == expected, name
    refused = {name: int(errors) for kind, name, errors in lines if kind == "override"}
    assert refused == {"bootstrap.servers": 1, "sasl.jaas.config": 1}
