"""The approval rules and the token store, without the stack: who may decide, on what,
until when."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import cast

import pytest
from fastapi import FastAPI

from flotilla.digest import command_digest
from flotilla.runner import ServiceContext
from flotilla.settings import MissingCredentials
from flotilla.workflow import Status
from services.policy import auth
from services.policy.api import install_routes
from services.policy.approval_rules import (
    Action,
    ProposalStatus,
    ProposalView,
    Refusal,
    check_incident,
    check_request,
    check_stored_steps,
    same_principal,
    seconds_left,
)
from services.policy.auth import DEMO_USERS, Person, TokenStore, UsersConfigError, bearer_token
from services.policy.commands import canonical_step, command_record
from services.policy.decide import PolicyEngine, Target
from services.policy.runtime import PolicyRuntime
from services.policy.service import build_spec
from services.policy.settings import PolicySettings
from services.policy.testing import step

NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 32
AGENT = "remediation-agent-1"
ALICE = Person("alice", frozenset({"approver"}))
BOB = Person("bob", frozenset({"viewer"}))


@pytest.fixture(scope="module")
def engine() -> PolicyEngine:
    return PolicyEngine.from_directory()


def view(**overrides: object) -> ProposalView:
    values: dict[str, object] = {
        "proposal_id": "9b2d7c1a-5e6f-4a3b-8c9d-0e1f2a3b4c5d",
        "incident_id": "incident-204",
        "proposed_by": AGENT,
        "digest": DIGEST,
        "status": ProposalStatus.PENDING,
        "deadline": NOW + timedelta(minutes=15),
        "targets": (Target("service", "production", "checkout-api"),),
        "required_role": "approver",
        "superseded_by": None,
    }
    values.update(overrides)
    return ProposalView(**values)  # type: ignore[arg-type]


def refusal(
    engine: PolicyEngine, person: Person, proposal: ProposalView, digest: str = DIGEST, **kw: object
) -> Refusal:
    action = kw.get("action", Action.APPROVE)
    now = kw.get("now", NOW)
    with pytest.raises(Refusal) as caught:
        check_request(engine, action, person, proposal, digest, now)  # type: ignore[arg-type]
    return caught.value


# ------------------------------------------------------------------- the rules


def test_an_approver_may_approve_the_exact_digest_in_time(engine: PolicyEngine) -> None:
    check = check_request(engine, Action.APPROVE, ALICE, view(), DIGEST, NOW)
    assert check.allowed
    assert check.policy_ids == ["approvers-may-decide"]


def test_a_viewer_may_neither_approve_nor_reject(engine: PolicyEngine) -> None:
    for action in Action:
        r = refusal(engine, BOB, view(), action=action)
        assert r.status == 403
        assert "bob holds no role" in r.detail


@pytest.mark.parametrize("name", [AGENT, "Remediation-Agent-1", f" {AGENT} "])
def test_the_proposer_never_approves_even_with_the_role(engine: PolicyEngine, name: str) -> None:
    r = refusal(engine, Person(name, frozenset({"approver"})), view())
    assert r.status == 403
    assert "cannot approve" in r.detail


def test_the_proposer_may_withdraw_by_rejecting(engine: PolicyEngine) -> None:
    check = check_request(engine, Action.REJECT, Person(AGENT, frozenset({"approver"})), view(), DIGEST, NOW)
    assert check.allowed


def test_a_wrong_digest_is_a_conflict(engine: PolicyEngine) -> None:
    r = refusal(engine, ALICE, view(), digest="sha256:" + "cd" * 32)
    assert r.status == 409
    assert r.detail.startswith("digest mismatch")


def test_who_you_are_is_checked_before_what_you_named(engine: PolicyEngine) -> None:
    assert refusal(engine, BOB, view(), digest="wrong").status == 403


@pytest.mark.parametrize(
    "status", [s for s in ProposalStatus if s not in (ProposalStatus.PENDING, ProposalStatus.SUPERSEDED)]
)
def test_a_decided_proposal_is_a_conflict(engine: PolicyEngine, status: ProposalStatus) -> None:
    r = refusal(engine, ALICE, view(status=status))
    assert r.status == 409
    assert f"is {status.value}" in r.detail
    assert not r.expire


def test_a_superseded_proposal_names_its_successor(engine: PolicyEngine) -> None:
    r = refusal(engine, ALICE, view(status=ProposalStatus.SUPERSEDED, superseded_by="newer-id"))
    assert r.status == 409
    assert "superseded by proposal newer-id" in r.detail


def test_past_the_deadline_is_a_conflict_that_expires_the_proposal(engine: PolicyEngine) -> None:
    proposal = view(deadline=NOW - timedelta(seconds=1))
    r = refusal(engine, ALICE, proposal)
    assert r.status == 409
    assert r.expire
    assert "deadline" in r.detail
    # exactly at the deadline is still in time
    assert check_request(engine, Action.APPROVE, ALICE, view(deadline=NOW), DIGEST, NOW).allowed


def test_the_role_is_checked_outside_cedar_too(tmp_path: Path) -> None:
    """A policy edit that lets everyone approve does not drop the role or proposer rule."""
    lax = (
        '@id("everyone-approves") @reason("anyone")\n'
        'permit (principal, action in [Action::"Approve", Action::"Reject"], resource);'
    )
    schema = Path(__file__).resolve().parents[3] / "infra" / "policies" / "flotilla.cedarschema"
    (tmp_path / "lax.cedar").write_text(lax)
    (tmp_path / "flotilla.cedarschema").write_text(schema.read_text())
    engine = PolicyEngine.from_directory(tmp_path)
    r = refusal(engine, BOB, view())
    assert (r.status, r.detail) == (403, "bob does not hold the approver role")
    r = refusal(engine, Person(AGENT, frozenset({"approver"})), view())
    assert r.status == 403
    assert "cannot approve" in r.detail


@pytest.mark.parametrize(
    ("status", "open_"),
    [
        (Status.NEW, True),
        (Status.PROPOSED, True),
        (Status.AWAITING_APPROVAL, True),
        (Status.AUTHORIZED, False),
        (Status.ESCALATED, False),
        (Status.RESOLVED, False),
        (Status.EXPIRED, False),
        (Status.REJECTED, False),
    ],
)
def test_an_incident_that_moved_on_takes_no_decision(status: Status, open_: bool) -> None:
    if open_:
        check_incident(view(), status)
    else:
        with pytest.raises(Refusal) as caught:
            check_incident(view(), status)
        assert caught.value.status == 409


def _stored(**params: object) -> tuple[list[dict[str, object]], ProposalView]:
    """Steps as the policy service stores them (canonical), and a view with their digest."""
    steps = [canonical_step(step("ScaleService", "incident-204", "9b2d7c1a-5e6f-4a3b-8c9d-0e1f2a3b4c5d", **params))]
    return steps, view(digest=command_digest(steps))  # type: ignore[arg-type]


def test_stored_steps_that_still_hash_to_the_digest_may_be_signed() -> None:
    steps, proposal = _stored(replicas=12)
    check_stored_steps(proposal, steps)
    # the commands an approval signs are rebuilt from those steps, and carry the same digest
    assert command_digest([command_record(s) for s in steps]) == proposal.digest


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(replicas=40),  # a bigger scale-out than the one proposed
        lambda s: s["target"].update(name="payments-api"),  # another service
        lambda s: s.update(expiresAt=s["expiresAt"] + 86_400_000),  # a command that lives a day longer
        lambda s: s.update(replicas={"not", "json"}),  # not even digestible
    ],
)
def test_stored_steps_edited_after_the_proposal_are_never_signed(edit: object) -> None:
    steps, proposal = _stored(replicas=12)
    edit(steps[0])  # type: ignore[operator]
    with pytest.raises(Refusal) as caught:
        check_stored_steps(proposal, steps)
    assert caught.value.status == 409
    assert "the stored proposal was edited after it was proposed" in caught.value.detail
    assert "nothing was signed" in caught.value.detail
    assert not caught.value.expire and not caught.value.withdraw


def test_an_edited_step_refuses_even_with_the_digest_the_approver_named(engine: PolicyEngine) -> None:
    """The approver names the stored digest and every other rule passes: the edit alone refuses."""
    steps, proposal = _stored(replicas=12)
    assert check_request(engine, Action.APPROVE, ALICE, proposal, proposal.digest, NOW).allowed
    steps[0]["replicas"] = 40
    with pytest.raises(Refusal, match="edited after it was proposed"):
        check_stored_steps(proposal, steps)


def test_seconds_left() -> None:
    assert seconds_left(NOW + timedelta(seconds=90.7), NOW) == 90
    assert seconds_left(NOW - timedelta(seconds=5), NOW) == 0
    assert seconds_left(None, NOW) == 0


def test_same_principal() -> None:
    assert same_principal("Alice", " alice ")
    assert not same_principal("alice", "alice2")


# -------------------------------------------------------------------- tokens


def test_tokens_authenticate_to_people() -> None:
    store = TokenStore(DEMO_USERS)
    assert store.authenticate("alice-token") == ALICE
    assert store.authenticate("bob-token") == BOB
    assert store.authenticate("carol-token") is None
    assert store.authenticate("") is None
    assert store.authenticate(None) is None


def test_only_digests_are_kept() -> None:
    store = TokenStore({"s3cret-token-value": {"user": "alice", "roles": ["approver"]}})
    kept = repr(vars(store))
    assert "s3cret-token-value" not in kept
    assert hashlib.sha256(b"s3cret-token-value").digest() in [d for d, _ in store._entries]


def test_a_configured_digest_is_used_as_is() -> None:
    hashed = "sha256:" + hashlib.sha256(b"from-a-vault").hexdigest()
    store = TokenStore({hashed: {"user": "dana", "roles": ["approver"]}})
    assert store.authenticate("from-a-vault") == Person("dana", frozenset({"approver"}))
    assert store.authenticate(hashed) is None


def test_every_entry_is_compared_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return original(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    users = {f"token-{i}": {"user": f"user-{i}", "roles": []} for i in range(5)}
    store = TokenStore(users)
    for token in ("token-0", "token-4", "nobody"):
        calls.clear()
        store.authenticate(token)
        assert len(calls) == 5


def test_bearer_header() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None
    assert TokenStore(DEMO_USERS).authenticate_header("Bearer alice-token") == ALICE


@pytest.mark.parametrize(
    "config",
    [
        "[]",
        '{"t": "alice"}',
        '{"t": {"roles": ["approver"]}}',
        '{"t": {"user": "", "roles": []}}',
        '{"t": {"user": "a", "roles": "approver"}}',
        '{"t": {"user": "a", "roles": [""]}}',
        '{"": {"user": "a", "roles": []}}',
        "not json",
    ],
)
def test_malformed_users_are_refused(config: str) -> None:
    with pytest.raises(UsersConfigError):
        TokenStore.from_json(config)


def test_the_same_token_twice_is_refused() -> None:
    hashed = "sha256:" + hashlib.sha256(b"t").hexdigest()
    with pytest.raises(UsersConfigError, match="twice"):
        TokenStore({"t": {"user": "a", "roles": []}, hashed: {"user": "b", "roles": []}})


# ------------------------------------------------------------------ settings


def _no_users(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "none.env"))
    for name in ("FLOTILLA_POLICY_USERS", "FLOTILLA_POLICY_USERS_FILE", "FLOTILLA_POLICY_DRY_RUN", "FLOTILLA_PROFILE"):
        monkeypatch.delenv(name, raising=False)


def test_settings_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_users(monkeypatch, tmp_path)
    settings = PolicySettings.load()
    assert settings.profile == "production"
    assert settings.policy_dry_run is False
    assert settings.approval_ttl_seconds == 900
    assert settings.approval_sweep_seconds == 1
    assert settings.http_port == 18104
    assert settings.service_database == "flotilla_policy"


@pytest.mark.parametrize("users", [None, "", "   "])
def test_production_refuses_to_start_without_users(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, users: str | None
) -> None:
    _no_users(monkeypatch, tmp_path)
    if users is not None:
        monkeypatch.setenv("FLOTILLA_POLICY_USERS", users)
    settings = PolicySettings.load()
    with pytest.raises(MissingCredentials, match="FLOTILLA_POLICY_USERS is not set") as refused:
        PolicyRuntime.from_settings(settings)  # what python -m services.policy does first
    assert "alice" not in str(refused.value) and "bob" not in str(refused.value)  # never names the demo users
    with pytest.raises(MissingCredentials):
        build_spec(settings=settings)


@pytest.mark.parametrize("profile", ["production", "demo"])
@pytest.mark.parametrize(
    ("where", "text", "problem"),
    [
        ("env", "{}", "FLOTILLA_POLICY_USERS names no users"),
        ("file", "{}", "FLOTILLA_POLICY_USERS_FILE .* names no users"),
        ("file", "", "not valid JSON"),
        ("file", "\n", "not valid JSON"),
    ],
)
def test_users_that_name_nobody_are_refused_in_every_profile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, profile: str, where: str, text: str, problem: str
) -> None:
    _no_users(monkeypatch, tmp_path)
    monkeypatch.setenv("FLOTILLA_PROFILE", profile)
    if where == "env":
        monkeypatch.setenv("FLOTILLA_POLICY_USERS", text)
    else:
        users = tmp_path / "users.json"
        users.write_text(text)
        monkeypatch.setenv("FLOTILLA_POLICY_USERS_FILE", str(users))
    with pytest.raises(UsersConfigError, match=problem):
        PolicyRuntime.from_settings(PolicySettings.load())


@pytest.mark.usefixtures("signing_keys")
def test_the_demo_profile_falls_back_to_the_demo_users_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _no_users(monkeypatch, tmp_path)
    monkeypatch.setenv("FLOTILLA_PROFILE", "demo")
    runtime = PolicyRuntime.from_settings(PolicySettings.load())
    assert runtime.demo_users
    assert runtime.tokens.authenticate("alice-token") == ALICE
    assert runtime.tokens.authenticate("bob-token") == BOB
    with caplog.at_level("WARNING"):
        install_routes(FastAPI(), cast(ServiceContext, None), runtime)
    assert "demo users" in caplog.text and "FLOTILLA_POLICY_USERS" in caplog.text


def test_configured_users_replace_the_demo_users_in_the_demo_profile_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_users(monkeypatch, tmp_path)
    monkeypatch.setenv("FLOTILLA_PROFILE", "demo")
    monkeypatch.setenv("FLOTILLA_POLICY_USERS", '{"tok": {"user": "erin", "roles": ["approver"]}}')
    store, demo = PolicySettings.load().token_store()
    assert not demo and store.authenticate("alice-token") is None


def test_an_unknown_profile_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_users(monkeypatch, tmp_path)
    monkeypatch.setenv("FLOTILLA_PROFILE", "staging")
    with pytest.raises(ValueError, match="profile"):
        PolicySettings.load()


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "none.env"))
    monkeypatch.setenv("FLOTILLA_POLICY_DRY_RUN", "1")
    monkeypatch.setenv("FLOTILLA_APPROVAL_TTL_SECONDS", "60")
    monkeypatch.setenv("FLOTILLA_POLICY_USERS", '{"tok": {"user": "erin", "roles": ["approver"]}}')
    settings = PolicySettings.load()
    store, demo = settings.token_store()
    assert not demo
    assert store.authenticate("tok") == Person("erin", frozenset({"approver"}))
    assert store.authenticate("alice-token") is None
    assert settings.policy_dry_run is True
    assert settings.approval_ttl_seconds == 60


def test_users_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    users = tmp_path / "users.json"
    users.write_text('{"filetok": {"user": "frank", "roles": ["viewer"]}}')
    monkeypatch.setenv("FLOTILLA_ENV_FILE", str(tmp_path / "none.env"))
    monkeypatch.delenv("FLOTILLA_POLICY_USERS", raising=False)
    monkeypatch.setenv("FLOTILLA_POLICY_USERS_FILE", str(users))
    store, demo = PolicySettings.load().token_store()
    assert not demo
    assert store.authenticate("filetok") == Person("frank", frozenset({"viewer"}))
