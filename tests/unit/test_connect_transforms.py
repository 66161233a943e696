"""infra/connect-transforms stays in step with what runs it (no Maven here; `make test-transforms`
runs its JUnit tests): the Kafka it compiles against, what its jar carries, and the class the
outbox connectors name."""

from __future__ import annotations

from pathlib import Path

from flotilla.connectors import DROP_NULL_HEADERS, OUTBOX_CONNECTOR_CLASS, SET_ASIDE, outbox_connector_config

from ..poms import LOCAL_STACK_POM, TRANSFORMS_POM, child_text, pom_elements, pom_property

MODULE = TRANSFORMS_POM.parent
MAIN_JAVA = MODULE / "src" / "main" / "java"
SERVICES = MODULE / "src" / "main" / "resources" / "META-INF" / "services"


def _source_of(class_name: str) -> Path:
    return MAIN_JAVA / (class_name.replace(".", "/") + ".java")


def test_compiled_against_the_kafka_the_local_stack_runs() -> None:
    assert pom_property(TRANSFORMS_POM, "kafka.version") == pom_property(LOCAL_STACK_POM, "kafka.version")
    assert pom_property(TRANSFORMS_POM, "maven.compiler.release") == "17"  # Kafka 4's and Debezium 3's Java


def test_the_jar_carries_our_classes_only() -> None:
    # Connect's API and Debezium (pgjdbc with it) are the worker's own; a second copy in the
    # plugin would shadow them. The Checker Framework's annotations are only for javac: pgjdbc's
    # classes, which WalWake uses, carry them.
    deps = {
        child_text(dep, "m:artifactId"): child_text(dep, "m:scope") or "compile"
        for dep in pom_elements(TRANSFORMS_POM, "m:dependencies/m:dependency")
    }
    assert deps == {
        "connect-api": "provided",
        "connect-transforms": "provided",
        "debezium-connector-postgres": "provided",
        "checker-qual": "provided",
        "junit-jupiter": "test",
    }


def test_the_connector_extends_the_debezium_the_stack_runs() -> None:
    assert pom_property(TRANSFORMS_POM, "debezium.version") == pom_property(LOCAL_STACK_POM, "debezium.version")


def test_the_connectors_name_the_connector_the_module_defines_and_registers() -> None:
    assert outbox_connector_config("flotilla")["connector.class"] == OUTBOX_CONNECTOR_CLASS
    assert _source_of(OUTBOX_CONNECTOR_CLASS).is_file()
    # Connect's service_load plugin discovery, and Debezium's queue lookup by name, read these files.
    assert (SERVICES / "org.apache.kafka.connect.source.SourceConnector").read_text().split() == [
        OUTBOX_CONNECTOR_CLASS
    ]
    queue_provider = "dev.flotilla.connect.SignallingQueueProvider"
    assert (SERVICES / "io.debezium.connector.base.QueueProvider").read_text().split() == [queue_provider]
    assert _source_of(queue_provider).is_file()


def test_the_pom_is_self_contained_for_strimzi_s_maven_build() -> None:
    # Strimzi fetches this POM to resolve the jar; a parent or an imported BOM would have to
    # come from a repository too, and Strimzi may look for those on Maven Central only
    # (strimzi-kafka-operator issue 7259).
    assert not pom_elements(TRANSFORMS_POM, "m:parent")
    assert not pom_elements(TRANSFORMS_POM, "m:dependencyManagement")


def test_every_build_plugin_is_pinned_for_offline_builds() -> None:
    # What `mvn verify` runs for a jar; an unpinned one would be resolved anew, online.
    plugins = {
        child_text(p, "m:artifactId"): child_text(p, "m:version")
        for p in pom_elements(TRANSFORMS_POM, "m:build/m:pluginManagement/m:plugins/m:plugin")
    }
    lifecycle = {"maven-resources-plugin", "maven-compiler-plugin", "maven-surefire-plugin", "maven-jar-plugin"}
    assert lifecycle <= set(plugins)
    assert all(plugins.values()), plugins
    assert not pom_elements(TRANSFORMS_POM, "m:build/m:plugins/m:plugin"), "versions live in pluginManagement"


def test_the_connectors_name_a_transform_the_module_defines_and_registers() -> None:
    config = outbox_connector_config("flotilla")
    named = {v for k, v in config.items() if k.startswith("transforms.") and k.endswith(".type")}
    ours = {name for name in named if name.startswith("dev.flotilla.")}
    assert ours == {DROP_NULL_HEADERS, SET_ASIDE}
    registered = (SERVICES / "org.apache.kafka.connect.transforms.Transformation").read_text().split()
    assert registered == [DROP_NULL_HEADERS, SET_ASIDE]  # Connect's service_load discovery finds it through this file
    for class_name in registered:
        assert _source_of(class_name).is_file(), class_name


def test_the_jar_reports_the_module_version() -> None:
    version_file = MAIN_JAVA.parent / "resources" / "dev" / "flotilla" / "connect" / "version.properties"
    assert version_file.read_text().strip() == "version=${project.version}"  # filtered by Maven
    resources = pom_elements(TRANSFORMS_POM, "m:build/m:resources/m:resource")
    assert [(child_text(r, "m:directory"), child_text(r, "m:filtering")) for r in resources] == [
        ("src/main/resources", "true")
    ]
