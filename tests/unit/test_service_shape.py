"""Every member is declared one way. One with a consumer loop: ``service.build_spec(settings)``
returns its ServiceSpec, and ``__main__`` is ``run_service(build_spec, <Settings>)``. One
that only serves HTTP (the sim, the console): ``app.build_app(settings)`` and
``run_app(build_app, <Settings>)``."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from flotilla import ServiceSettings
from flotilla.fleet import AGENTS, CONSOLE, SIM, Member

REPO_ROOT = Path(__file__).resolve().parents[2]


def _main_call(member: Member) -> ast.Call:
    tree = ast.parse((REPO_ROOT / member.module.replace(".", "/") / "__main__.py").read_text())
    body = [n for n in tree.body if not isinstance(n, ast.Import | ast.ImportFrom | ast.Expr)]
    assert len(body) == 1 and isinstance(body[0], ast.If), f"{member.module}.__main__ does more than run"
    (statement,) = body[0].body
    assert isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
    return statement.value


@pytest.mark.parametrize("member", AGENTS, ids=lambda m: m.name)
def test_main_is_run_service_of_build_spec_and_the_settings_class(member: Member) -> None:
    call = _main_call(member)
    assert isinstance(call.func, ast.Name) and call.func.id == "run_service"
    spec_arg, settings_arg = call.args
    assert isinstance(spec_arg, ast.Name) and spec_arg.id == "build_spec"
    assert isinstance(settings_arg, ast.Name)
    settings_class = getattr(importlib.import_module(f"{member.module}.settings"), settings_arg.id)
    assert issubclass(settings_class, ServiceSettings)
    # the class loads itself with the one shared loader, and names the member
    assert settings_class.load.__func__ is ServiceSettings.load.__func__  # type: ignore[attr-defined]
    assert settings_class.model_fields["service_name"].default == member.name


@pytest.mark.parametrize("member", AGENTS, ids=lambda m: m.name)
def test_build_spec_takes_the_settings_and_returns_a_spec(member: Member) -> None:
    build_spec = importlib.import_module(f"{member.module}.service").build_spec
    first = next(iter(inspect.signature(build_spec).parameters.values()))
    assert first.name == "settings"
    assert "ServiceSpec" in str(inspect.signature(build_spec).return_annotation)


@pytest.mark.parametrize("member", [SIM, CONSOLE], ids=lambda m: m.name)
def test_an_http_only_member_runs_its_build_app_the_one_way_too(member: Member) -> None:
    call = _main_call(member)
    assert isinstance(call.func, ast.Name) and call.func.id == "run_app"
    app_arg, settings_arg = call.args
    assert isinstance(app_arg, ast.Name) and app_arg.id == "build_app"
    assert isinstance(settings_arg, ast.Name)
    settings_class = getattr(importlib.import_module(f"{member.module}.settings"), settings_arg.id)
    assert issubclass(settings_class, ServiceSettings)
    build_app = importlib.import_module(f"{member.module}.app").build_app
    assert list(inspect.signature(build_app).parameters) == ["settings"]
