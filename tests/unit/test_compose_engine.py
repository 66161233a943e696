"""The compose lane's image cache: a stand-in is rebuilt exactly when its recipe changed,
and never over an image this tool did not build (infra/compose/engine.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.scripts import load_script

REPO_ROOT = Path(__file__).resolve().parents[2]
engine = load_script("flotilla_compose_engine_unit", REPO_ROOT / "infra" / "compose" / "engine.py")


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> object:
    folder = tmp_path / "standins" / "kafka"
    (folder / "bin").mkdir(parents=True)
    (folder / "Dockerfile").write_text("FROM base\n")
    (folder / "bin" / "kafka-topics.sh").write_text("#!/bin/sh\n")
    jars = tmp_path / "libs"
    jars.mkdir()
    (jars / "kafka-clients-4.3.0.jar").write_bytes(b"x" * 10)
    monkeypatch.setattr(engine, "STANDINS", tmp_path / "standins")
    return engine.StandIn("apache/kafka:4.3.0", "kafka", ((jars, "libs"),))


def test_the_recipe_is_stable_and_changes_with_what_builds_the_image(standin: object, tmp_path: Path) -> None:
    first = engine.recipe(standin, "sha256:base1")
    assert engine.recipe(standin, "sha256:base1") == first
    assert engine.recipe(standin, "sha256:base2") != first  # a new base image

    (tmp_path / "standins" / "kafka" / "Dockerfile").write_text("FROM base\nRUN true\n")
    edited = engine.recipe(standin, "sha256:base1")
    assert edited != first

    script = tmp_path / "standins" / "kafka" / "bin" / "kafka-topics.sh"
    script.chmod(0o755)
    executable = engine.recipe(standin, "sha256:base1")
    assert executable != edited  # the mode is part of the image

    jar = tmp_path / "libs" / "kafka-clients-4.3.0.jar"
    jar.rename(tmp_path / "libs" / "kafka-clients-4.3.1.jar")
    assert engine.recipe(standin, "sha256:base1") != executable  # a new version of a jar


def test_only_a_missing_or_outdated_image_of_ours_is_built() -> None:
    ours = {engine.LABEL: "apache/kafka:4.3.0", engine.RECIPE_LABEL: "abc"}
    assert engine.must_build(None, "abc")  # no image of that name
    assert not engine.must_build(ours, "abc")  # current
    assert engine.must_build(ours, "def")  # its recipe changed
    assert engine.must_build(ours, "abc", rebuild=True)
    assert engine.must_build({engine.LABEL: "x"}, "abc")  # ours, from before recipes were labelled
    # Somebody's real official image: used as it is, never replaced, even when asked to rebuild.
    assert not engine.must_build({"org.opencontainers.image.source": "upstream"}, "abc")
    assert not engine.must_build({}, "abc", rebuild=True)
