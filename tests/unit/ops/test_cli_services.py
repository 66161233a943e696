"""Commands backed by the fleet's HTTP APIs (through FleetApi), against stand-in services:
timelines, approvals, the DLQ, audit verification — rendering, what is sent, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from flotilla_ops.cli import Runtime, app
from flotilla_ops.fleetapi import FleetApi, FleetEndpoints
from typer.testing import CliRunner

from flotilla.settings import StackSettings

from .fakes import Services

PROPOSAL = "0b9f2a3c-1d4e-4f50-8a6b-7c8d9e0f1a2b"
DIGEST = "sha256:" + "ab" * 32


def proposal(status: str = "pending") -> dict[str, Any]:
    return {
        "proposalId": PROPOSAL,
        "incidentId": "incident-12",
        "status": status,
        "decision": "needs-approval",
        "dryRun": False,
        "summary": "scale checkout-api to 12",
        "digest": DIGEST,
        "commands": [
            {
                "commandId": "c-1",
                "kind": "ScaleService",
                "target": "production/checkout-api",
                "description": "scale checkout-api from 4 to 12 replicas",
                "idempotencyKey": "incident-12:scale:12",
                "expiresAt": "2024-05-01T12:15:00+00:00",
            }
        ],
        "reasons": ["scaling beyond 2x in production needs a person"],
        "requiredRole": "approver",
        "proposedBy": "remediation-agent",
        "proposedAt": "2024-05-01T12:00:00+00:00",
        "deadline": "2024-05-01T12:15:00+00:00",
        "secondsLeft": 812,
    }


def invoke(cli: CliRunner, rt: Runtime, *args: str, stdin: str | None = None) -> Any:
    return cli.invoke(app, list(args), obj=rt, input=stdin)


# ------------------------------------------------------------------ incidents

TIMELINE = {
    "incidentId": "incident-12",
    "status": "RESOLVED",
    "firstAt": "2024-05-01T12:00:00.000Z",
    "lastAt": "2024-05-01T12:00:01.500Z",
    "entries": 3,
    "timeline": [
        {"seq": 40, "topic": "incidents", "type": "dev.flotilla.incidents.ServiceLatencyIncreased",
         "eventId": "e1", "source": "/flotilla/health-agent", "elapsedMs": 0, "causationId": None,
         "causedBy": None, "value": {"service": "checkout-api"}},
        {"seq": 41, "topic": "incidents", "type": "dev.flotilla.incidents.DiagnosisRequested",
         "eventId": "e2", "source": "/flotilla/health-agent", "elapsedMs": 12, "causationId": "e1",
         "causedBy": {"seq": 40, "type": "dev.flotilla.incidents.ServiceLatencyIncreased", "eventId": "e1"},
         "value": {}},
        {"seq": 45, "topic": "incidents.dlq", "type": "dev.flotilla.incidents.DiagnosisRequested",
         "eventId": "e2", "source": "/flotilla/health-agent", "elapsedMs": 1500, "causationId": "e1",
         "causedBy": {"seq": 40, "type": "dev.flotilla.incidents.ServiceLatencyIncreased", "eventId": "e1"},
         "value": {}, "deadLetter": {"reason": "retries-exhausted"}},
    ],
}  # fmt: skip


def test_timeline_shows_elapsed_time_causes_and_gaps(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    services.on("GET", "/incidents/incident-12/timeline", 200, TIMELINE)
    result = invoke(cli, http_runtime, "incidents", "show", "incident-12")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("incident incident-12  status RESOLVED  3 records")
    assert "#1" in lines[2] and "+0 ms" in lines[2] and "ServiceLatencyIncreased" in lines[2]
    assert "+12 ms" in lines[3] and "+12 " in lines[3] and "#1 ServiceLatencyIncreased (+12 ms)" in lines[3]
    assert "[DLQ retries-exhausted]" in lines[4] and "+1488" in lines[4] and "(+1500 ms)" in lines[4]

    data = json.loads(invoke(cli, http_runtime, "incidents", "show", "incident-12", "--json").stdout)
    second = data["timeline"][1]
    assert (second["position"], second["sincePreviousMs"], second["causePosition"], second["sinceCauseMs"]) == (
        2,
        12,
        1,
        12,
    )
    assert data["timeline"][0]["sincePreviousMs"] is None and "causePosition" not in data["timeline"][0]


def test_a_long_timeline_comes_in_pages_and_says_how_to_get_the_next(
    cli: CliRunner, http_runtime: Runtime, services: Services
) -> None:
    later = dict(
        TIMELINE["timeline"][2], seq=145, causedBy={"seq": 40, "type": "dev.flotilla.incidents.X", "eventId": "e1"}
    )
    page = {**TIMELINE, "timeline": [later], "page": {"after": 100, "limit": 1, "nextAfter": 145}}
    services.on("GET", "/incidents/incident-12/timeline", 200, page)
    result = invoke(cli, http_runtime, "incidents", "show", "incident-12", "--after", "100", "--limit", "1")
    assert result.exit_code == 0, result.stderr
    sent = services.requests[-1].url.params
    assert (sent["after"], sent["limit"]) == ("100", "1")
    assert "seq 40 X (another page)" in result.stdout  # a cause on another page is named, not "not in this incident"
    assert result.stdout.rstrip().endswith("more records: flotilla incidents show incident-12 --after 145 --limit 1")
    data = json.loads(invoke(cli, http_runtime, "incidents", "show", "incident-12", "--json").stdout)
    assert data["page"]["nextAfter"] == 145
    assert "after" not in services.requests[-1].url.params and "limit" not in services.requests[-1].url.params
    last = {**TIMELINE, "page": {"after": 0, "limit": 500, "nextAfter": None}}
    services.on("GET", "/incidents/incident-12/timeline", 200, last)
    assert "more records" not in invoke(cli, http_runtime, "incidents", "show", "incident-12").stdout
    refused = invoke(cli, http_runtime, "incidents", "show", "incident-12", "--limit", "0")
    assert refused.exit_code != 0


def test_incidents_list_and_a_missing_incident(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    row = {"incidentId": "incident-12", "status": "RESOLVED", "firstAt": "a", "lastAt": "b", "entries": 3}
    services.on("GET", "/incidents", 200, {"incidents": [row]})
    result = invoke(cli, http_runtime, "incidents", "list")
    assert result.exit_code == 0 and "incident-12  RESOLVED" in result.stdout
    assert json.loads(invoke(cli, http_runtime, "--json", "incidents", "list").stdout) == {"incidents": [row]}
    services.on("GET", "/incidents/nope/timeline", 404, {"detail": {"error": "no audited records for incident nope"}})
    missing = invoke(cli, http_runtime, "incidents", "show", "nope")
    assert missing.exit_code == 1 and "no audited records for incident nope" in missing.stderr


def test_an_unreachable_service_exits_3(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    services.down = True
    result = invoke(cli, http_runtime, "incidents", "list")
    assert result.exit_code == 3 and "unreachable" in result.stderr
    as_json = json.loads(invoke(cli, http_runtime, "incidents", "list", "--json").stdout)
    assert as_json["exitCode"] == 3 and as_json["status"] == 0


# ------------------------------------------------------------------ approvals

APPROVE = f"/approvals/{PROPOSAL}/approve"
REJECT = f"/approvals/{PROPOSAL}/reject"
DECIDED = {"proposalId": PROPOSAL, "incidentId": "incident-12", "status": "approved", "by": "alice"}


def test_approve_shows_the_proposal_asks_and_sends_the_digest_shown(
    cli: CliRunner, http_runtime: Runtime, services: Services
) -> None:
    services.on("GET", f"/approvals/{PROPOSAL}", 200, proposal())
    services.on("POST", APPROVE, 200, DECIDED)
    result = invoke(cli, http_runtime, "approve", PROPOSAL, "--token", "alice-token", stdin="y\n")
    assert result.exit_code == 0, result.stderr
    for shown in ("incident-12", DIGEST, "scale checkout-api from 4 to 12 replicas", "scaling beyond 2x",
                  "812 s left", "deadline 2024-05-01T12:15:00+00:00", "incident-12:scale:12"):  # fmt: skip
        assert shown in result.stdout
    assert f"Approve exactly these commands (digest {DIGEST})?" in result.stdout
    assert services.posted(APPROVE) == [{"digest": DIGEST}]
    assert all(r.headers["Authorization"] == "Bearer alice-token" for r in services.requests)
    assert "approved by alice" in result.stdout


CHANGE_DIGEST = "sha256:" + "c" * 64


def test_approve_shows_each_commands_change_and_sends_the_change_digest_shown(
    cli: CliRunner, http_runtime: Runtime, services: Services
) -> None:
    shown = proposal()
    shown["changeDigest"] = CHANGE_DIGEST
    shown["commands"] = [
        {**shown["commands"][0], "change": {"lines": ["images: shop=shop:1.5 → shop=shop:1.4"], "digest": "x"}},
        {**shown["commands"][0], "commandId": "c-2", "change": {"unavailable": "the sim cannot dry-run a change"}},
    ]
    services.on("GET", f"/approvals/{PROPOSAL}", 200, shown)
    services.on("POST", APPROVE, 200, DECIDED)
    result = invoke(cli, http_runtime, "approve", PROPOSAL, "--token", "alice-token", stdin="y\n")
    assert result.exit_code == 0, result.stderr
    assert "images: shop=shop:1.5 → shop=shop:1.4" in result.stdout
    assert "change: not shown (the sim cannot dry-run a change)" in result.stdout
    assert f"changes {CHANGE_DIGEST}" in result.stdout
    assert services.posted(APPROVE) == [{"digest": DIGEST, "changeDigest": CHANGE_DIGEST}]


def test_declining_sends_nothing(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    services.on("GET", f"/approvals/{PROPOSAL}", 200, proposal())
    result = invoke(cli, http_runtime, "approve", PROPOSAL, "--token", "alice-token", stdin="n\n")
    assert result.exit_code == 1
    assert services.posted(APPROVE) == []


def test_reject_with_a_reason_and_the_token_from_the_environment(
    cli: CliRunner, http_runtime: Runtime, services: Services
) -> None:
    services.on("GET", f"/approvals/{PROPOSAL}", 200, proposal())
    services.on("POST", REJECT, 200, {**DECIDED, "status": "rejected"})
    result = cli.invoke(
        app, ["--json", "reject", PROPOSAL, "--reason", "wrong service", "--yes"], obj=http_runtime,
        env={"FLOTILLA_TOKEN": "alice-token"},
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout
    assert services.posted(REJECT) == [{"digest": DIGEST, "reason": "wrong service"}]
    answer = json.loads(result.stdout)
    assert answer["decision"]["status"] == "rejected" and answer["digest"] == DIGEST
    assert answer["proposal"]["incidentId"] == "incident-12"


def test_approval_refusals_and_guards(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    services.on("GET", f"/approvals/{PROPOSAL}", 200, proposal())
    # no token: usage, nothing asked
    assert invoke(cli, http_runtime, "approve", PROPOSAL, "--yes").exit_code == 2
    # JSON cannot prompt
    assert invoke(cli, http_runtime, "--json", "approve", PROPOSAL, "--token", "t").exit_code == 2
    # a digest the caller expected but the proposal no longer has
    stale = invoke(cli, http_runtime, "approve", PROPOSAL, "--token", "t", "--yes", "--digest", "sha256:00")
    assert stale.exit_code == 1 and "nothing sent" in stale.stderr
    assert services.posted(APPROVE) == []
    # the policy service refuses (viewer: 403; stale digest: 409)
    services.on("POST", APPROVE, 403, {"detail": "bob lacks the approver role", "policyIds": []})
    refused = invoke(cli, http_runtime, "approve", PROPOSAL, "--token", "bob-token", "--yes")
    assert refused.exit_code == 1 and "403 bob lacks the approver role" in refused.stderr
    services.on("POST", APPROVE, 409, {"detail": "digest mismatch", "policyIds": []})
    assert invoke(cli, http_runtime, "approve", PROPOSAL, "--token", "t", "--yes").exit_code == 1
    # already decided: refused locally, nothing sent
    services.requests.clear()
    services.on("GET", f"/approvals/{PROPOSAL}", 200, proposal("approved"))
    done = invoke(cli, http_runtime, "approve", PROPOSAL, "--token", "t", "--yes")
    assert done.exit_code == 1 and "is approved" in done.stderr
    assert services.posted(APPROVE) == []


def test_whoami_names_the_person_and_roles(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    services.on("GET", "/me", 200, {"user": "alice", "roles": ["approver"]})
    result = invoke(cli, http_runtime, "whoami", "--token", "alice-token")
    assert result.exit_code == 0 and result.stdout.strip() == "alice (approver)"
    assert services.requests[-1].headers["authorization"] == "Bearer alice-token"
    assert json.loads(invoke(cli, http_runtime, "--json", "whoami", "--token", "t").stdout)["user"] == "alice"
    services.on("GET", "/me", 401, {"detail": "a valid bearer token is required"})
    refused = invoke(cli, http_runtime, "whoami", "--token", "made-up")
    assert refused.exit_code == 1 and "a valid bearer token is required" in refused.stderr
    assert invoke(cli, http_runtime, "whoami").exit_code == 2  # no token: nothing sent


def test_approvals_list(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    services.on("GET", "/approvals", 200, [proposal()])
    result = invoke(cli, http_runtime, "approvals", "list", "--token", "bob-token", "--status", "all")
    assert result.exit_code == 0
    assert PROPOSAL in result.stdout and "scale checkout-api from 4 to 12 replicas" in result.stdout
    assert services.requests[-1].url.params["status"] == "all"
    listed = json.loads(invoke(cli, http_runtime, "approvals", "list", "--token", "t", "--json").stdout)
    assert listed["approvals"][0]["digest"] == DIGEST


# ------------------------------------------------------------------ DLQ

ENTRY = "5c1e3f0a-2b4d-4e6f-8a0b-1c2d3e4f5a6b"
ENTRY_BODY = {
    "id": ENTRY,
    "status": "quarantined",
    "incidentId": "incident-12",
    "origin": {"topic": "incidents", "partition": 1, "offset": 77},
    "consumer": "executor",
    "reason": "invalid-record",
    "errorClass": "BusinessRuleViolation",
    "errorMessage": "replicas must be positive",
    "attempts": 1,
    "originalEventId": "e9",
    "originalType": "dev.flotilla.commands.ScaleService",
    "headers": [{"name": "ce_id", "text": "e9", "base64": "ZTk="}],
    "value": {"base64": "AA==", "decoded": {"recordType": "x", "schemaId": 3, "fields": {"replicas": -1}}},
}


def test_requeue_with_a_sanitized_value(
    cli: CliRunner, http_runtime: Runtime, services: Services, tmp_path: Path
) -> None:
    services.on("GET", f"/quarantine/{ENTRY}", 200, ENTRY_BODY)
    services.on(
        "POST",
        f"/quarantine/{ENTRY}/requeue",
        200,
        {"id": ENTRY, "status": "requeued", "eventId": "e9", "recordType": "ScaleService", "sanitized": True,
         "requeuedBy": "operator", "requeuedTo": {"topic": "incidents", "partition": 1, "offset": 90}},
    )  # fmt: skip
    fixed = tmp_path / "fixed.json"
    fixed.write_text('{"replicas": 3}')
    result = invoke(cli, http_runtime, "dlq", "requeue", ENTRY, "--value-file", str(fixed), "--token", "op", "--yes")
    assert result.exit_code == 0, result.stderr
    assert services.posted(f"/quarantine/{ENTRY}/requeue") == [{"value": {"replicas": 3}}]
    assert "re-queued ScaleService e9 to incidents[1]@90 as operator (sanitized)" in result.stdout


def test_requeue_refusals(cli: CliRunner, http_runtime: Runtime, services: Services, tmp_path: Path) -> None:
    services.on("GET", f"/quarantine/{ENTRY}", 200, ENTRY_BODY)
    broken = tmp_path / "broken.json"
    broken.write_text('{"replicas": ')
    bad_file = invoke(cli, http_runtime, "dlq", "requeue", ENTRY, "--value-file", str(broken), "--token", "op", "--yes")
    assert bad_file.exit_code == 2 and "not valid JSON" in bad_file.stderr
    assert services.requests == []  # nothing asked, nothing sent
    assert invoke(cli, http_runtime, "dlq", "requeue", ENTRY, "--yes").exit_code == 2  # no token
    services.on(
        "POST",
        f"/quarantine/{ENTRY}/requeue",
        422,
        {"detail": {"error": "the sanitized value does not match", "problems": ["field 'replicas': expected int"]}},
    )
    invalid = invoke(cli, http_runtime, "dlq", "requeue", ENTRY, "--token", "op", "--yes")
    assert invalid.exit_code == 2 and "field 'replicas': expected int" in invalid.stderr
    services.on("GET", f"/quarantine/{ENTRY}", 200, {**ENTRY_BODY, "status": "requeued"})
    again = invoke(cli, http_runtime, "dlq", "requeue", ENTRY, "--token", "op", "--yes")
    assert again.exit_code == 1 and "already re-queued" in again.stderr


def test_dlq_list_and_show(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    services.on("GET", "/quarantine", 200, {"entries": [ENTRY_BODY]})
    services.on("GET", f"/quarantine/{ENTRY}", 200, ENTRY_BODY)
    listed = invoke(cli, http_runtime, "dlq", "list", "--incident", "incident-12", "--status", "quarantined")
    assert listed.exit_code == 0 and "incidents[1]@77" in listed.stdout
    wanted = {"incident": "incident-12", "status": "quarantined", "limit": "100"}
    assert dict(services.requests[-1].url.params) == wanted
    shown = invoke(cli, http_runtime, "dlq", "show", ENTRY)
    assert "invalid-record: BusinessRuleViolation: replicas must be positive" in shown.stdout
    assert '"replicas": -1' in shown.stdout


# ------------------------------------------------------------------ audit


def test_audit_verify_exit_codes(cli: CliRunner, http_runtime: Runtime, services: Services) -> None:
    ok = {"ok": True, "entriesChecked": 120, "lastSeq": 120, "lastHash": "ff", "firstBroken": None, "keyId": "k1"}
    services.on("GET", "/verify", 200, ok)
    result = invoke(cli, http_runtime, "audit", "verify")
    assert result.exit_code == 0 and "intact: 120 entries checked" in result.stdout
    broken = {**ok, "ok": False, "firstBroken": {"seq": 57, "problem": "entry hash does not match"}}
    services.on("GET", "/verify", 200, broken)
    result = invoke(cli, http_runtime, "audit", "verify", "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["firstBroken"]["seq"] == 57


def test_http_timeouts(cli: CliRunner, services: Services) -> None:
    asked: list[float] = []

    def api(timeout: float) -> FleetApi:
        asked.append(timeout)
        return FleetApi(FleetEndpoints(), transport=httpx.MockTransport(services.handle))

    rt = Runtime(settings_factory=StackSettings, api_factory=api)
    services.on("GET", "/incidents", 200, {"incidents": []})
    services.on("GET", "/verify", 200, {"ok": True})
    assert cli.invoke(app, ["--http-timeout", "3", "incidents", "list"], obj=rt).exit_code == 0
    assert cli.invoke(app, ["incidents", "list"], obj=rt, env={"FLOTILLA_HTTP_TIMEOUT": "4"}).exit_code == 0
    assert cli.invoke(app, ["audit", "verify"], obj=rt).exit_code == 0  # walks the whole log: a long default
    assert cli.invoke(app, ["audit", "verify", "--timeout", "30"], obj=rt).exit_code == 0
    assert asked == [3.0, 4.0, 600.0, 30.0]
