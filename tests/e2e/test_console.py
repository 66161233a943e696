"""The web console in a real browser against the running fleet: a viewer is refused, an
approver approves the digest shown and watches the executor's outcome arrive in the
incident's timeline; dead letters are inspected and a bad re-queue is explained.

Drives Debian's chromium through Playwright (no ``playwright install``). With
``FLOTILLA_SCREENSHOTS=1`` the main pages are saved to ``docs/screenshots/console-*.png``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flotilla.authority import attest_proposal
from flotilla.fleet import CONSOLE, url

from .fleet import (
    APPROVER,
    DEMO_SERVICE,
    PROPOSED,
    VIEWER,
    Fleet,
    Watch,
    awaiting_approval,
    counter_proposal,
    produce,
)

playwright_api = pytest.importorskip("playwright.sync_api")
expect = playwright_api.expect

pytestmark = pytest.mark.timeout(300)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CONSOLE_URL = url(CONSOLE)


def shot(page: object, name: str) -> None:
    if os.environ.get("FLOTILLA_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"console-{name}.png"), full_page=True)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    with playwright_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


def signed_in(browser: object, token: str) -> object:
    """A fresh browser context (its own cookies) signed in with ``token``."""
    context = browser.new_context(viewport={"width": 1360, "height": 900})  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(f"{CONSOLE_URL}/approvals")
    expect(page).to_have_url(re.compile(r"/login\?next="))
    page.fill("#token", token)
    page.click("button[type=submit]")
    expect(page.locator(".flash.ok")).to_contain_text("Signed in as ")
    return page


def test_login_page_and_an_unknown_token(fleet: Fleet, browser: object) -> None:
    context = browser.new_context(viewport={"width": 1360, "height": 700})  # type: ignore[attr-defined]
    page = context.new_page()
    page.goto(CONSOLE_URL)
    expect(page.locator("h1")).to_have_text("Sign in")
    shot(page, "login")
    page.fill("#token", "not-a-token")
    page.click("button[type=submit]")
    expect(page.locator(".flash.error")).to_contain_text("does not accept this token")
    # the session cookie is out of reach of page scripts
    cookies = context.cookies()
    assert cookies and all(c["httpOnly"] and c["sameSite"] == "Strict" for c in cookies)
    context.close()


def test_a_viewer_is_refused_and_an_approver_approves_and_sees_the_outcome(
    fleet: Fleet, watch: Watch, browser: object
) -> None:
    bob = signed_in(browser, VIEWER)
    alice = signed_in(browser, APPROVER)
    expect(bob.locator("#who")).to_have_text("signed in as bob (viewer)")  # type: ignore[attr-defined]
    expect(alice.locator("#who")).to_have_text("signed in as alice (approver)")  # type: ignore[attr-defined]

    incident, request = awaiting_approval(fleet, watch)
    proposal, digest = str(request.value["proposalId"]), str(request.value["digest"])

    # a poisoned competing proposal: policy dead-letters it (its digest is not its steps')
    first = watch.kind("RecoveryProposed", incident)
    # the agent itself attested a wrong digest: believed as the agent's, and a broken record
    poison, envelope = counter_proposal(first, replicas=10, signer=None, digest="sha256:" + "f" * 64)
    poison = attest_proposal(fleet.agent_signer, poison, now=datetime.now(UTC))
    produce(fleet, "incidents", incident, PROPOSED, poison, envelope)

    # the viewer sees the proposal and is refused
    bob.goto(f"{CONSOLE_URL}/approvals/{proposal}")  # type: ignore[attr-defined]
    expect(bob.locator("#role-warning")).to_contain_text("do not hold the approver role")  # type: ignore[attr-defined]
    bob.click("#approve")  # type: ignore[attr-defined]
    refusal = bob.locator(".flash.error")  # type: ignore[attr-defined]
    expect(refusal).to_contain_text("Refused (403)")
    expect(refusal).to_contain_text(re.compile(r"The policy service said: bob .*approv"))
    shot(bob, "refused")

    # the approver: the pending list, then the proposal in full context (its evidence is
    # read from the audit timeline when the page renders: wait until audit has it)
    diagnosed = fleet.audit_timeline(incident, lambda entries: any("Suspected" in e["type"] for e in entries))
    assert any("Suspected" in e["type"] for e in diagnosed), [e["type"] for e in diagnosed]
    alice.goto(f"{CONSOLE_URL}/approvals")  # type: ignore[attr-defined]
    row = alice.locator(f'tr[data-proposal="{proposal}"]')  # type: ignore[attr-defined]
    expect(row).to_be_visible()
    expect(row.locator(".countdown")).to_contain_text("left")
    shot(alice, "approvals")
    row.locator("a.button").click()
    expect(alice.locator("#shown-digest")).to_have_text(digest)  # type: ignore[attr-defined]
    expect(alice.locator(".decision")).to_contain_text("matches the steps shown")  # type: ignore[attr-defined]
    expect(alice.locator("#role-warning")).to_have_count(0)  # type: ignore[attr-defined]
    expect(alice.locator(".diagnosis").first).to_be_visible()  # type: ignore[attr-defined]
    expect(alice.locator("table.evidence").first).to_be_visible()  # type: ignore[attr-defined]
    shot(alice, "approval")
    alice.click("#approve")  # type: ignore[attr-defined]

    # the console lands on the timeline, which refreshes itself until the incident ends
    expect(alice).to_have_url(f"{CONSOLE_URL}/incidents/{incident}")
    expect(alice.locator(".flash.ok")).to_contain_text("Approved by alice")  # type: ignore[attr-defined]
    approved = watch.kind("RecoveryApproved", incident)
    assert approved.value["approvedBy"] == "alice" and approved.value["auto"] is False
    outcome = alice.locator("#outcome")  # type: ignore[attr-defined]
    expect(outcome.locator('li[data-type="RecoveryExecuted"]')).to_be_visible(timeout=60_000)
    expect(outcome.locator('li[data-type="RecoveryCompleted"]')).to_be_visible(timeout=60_000)
    expect(outcome).to_contain_text(f"{DEMO_SERVICE} scaled from")
    entries = alice.locator("table.timeline tr.entry")  # type: ignore[attr-defined]
    kinds = [entries.nth(i).get_attribute("data-type") for i in range(entries.count())]
    for kind in ("ServiceLatencyIncreased", "HumanApprovalRequired", "RecoveryApproved", "RecoveryExecuted"):
        assert kind in kinds, kinds
    assert kinds.index("RecoveryApproved") < kinds.index("RecoveryExecuted") < kinds.index("RecoveryCompleted")
    shot(alice, "timeline")

    # the poisoned proposal in the DLQ: listed, inspected, and a bad re-queue explained
    watch.wait(
        lambda s: s.kind == "DeadLetterQuarantined" and str(s.value.get("originalEventId")) == envelope.id,
        what="DeadLetterQuarantined for the poisoned proposal",
    )
    alice.goto(f"{CONSOLE_URL}/dlq?incident={incident}")  # type: ignore[attr-defined]
    dlq_row = alice.locator("tr.dlq-row").first  # type: ignore[attr-defined]
    expect(dlq_row).to_contain_text("BusinessRuleViolation")
    shot(alice, "dlq")
    dlq_row.locator("a.button").click()
    expect(alice.locator("#decoded-fields")).to_contain_text(poison["proposalId"])  # type: ignore[attr-defined]
    # alice is no operator: her own token is refused by the DLQ reconciler
    alice.click("#requeue button[type=submit]")  # type: ignore[attr-defined]
    expect(alice.locator("#requeue .flash.error")).to_contain_text("does not accept this operator token")  # type: ignore[attr-defined]
    # an operator's sanitized value that breaks the schema: refused, naming the field
    alice.click("#copy-decoded")  # type: ignore[attr-defined]
    sanitized = alice.input_value("#value").replace('"digest": "sha256:', '"digest": 7, "_was": "')  # type: ignore[attr-defined]
    alice.fill("#value", sanitized)  # type: ignore[attr-defined]
    alice.fill("#operator_token", "operator-token")  # type: ignore[attr-defined]
    alice.click("#requeue button[type=submit]")  # type: ignore[attr-defined]
    expect(alice.locator("#requeue .flash.error")).to_contain_text("Refused (422)")  # type: ignore[attr-defined]
    expect(alice.locator("#requeue ul.problems")).to_contain_text("digest")  # type: ignore[attr-defined]
    shot(alice, "dlq-entry")
    entry = fleet.dlq("GET", f"/quarantine?incident={incident}")["entries"][0]
    assert entry["status"] == "quarantined"  # nothing was re-queued


def test_signing_out_ends_the_session_for_a_copied_cookie_too(fleet: Fleet, browser: object) -> None:
    """A cookie copied before sign-out (a proxy log, a shared machine) opens nothing after it,
    and a decision posted with it is refused before it reaches the policy service."""
    alice = signed_in(browser, APPROVER)
    alice.goto(f"{CONSOLE_URL}/approvals")  # type: ignore[attr-defined]
    copied = [c for c in alice.context.cookies() if c["name"] == "flotilla_console"]  # type: ignore[attr-defined]
    assert len(copied) == 1 and "alice" not in copied[0]["value"] and APPROVER not in copied[0]["value"]
    csrf = alice.locator("form.logout input[name=csrf]").get_attribute("value")  # type: ignore[attr-defined]

    thief = browser.new_context(viewport={"width": 1360, "height": 700})  # type: ignore[attr-defined]
    thief.add_cookies(copied)
    page = thief.new_page()
    page.goto(f"{CONSOLE_URL}/approvals")
    expect(page.locator("#who")).to_have_text("signed in as alice (approver)")  # the copy works before sign-out

    alice.click("form.logout button[type=submit]")  # type: ignore[attr-defined]
    expect(alice.locator(".flash.ok")).to_contain_text("Signed out.")  # type: ignore[attr-defined]

    thief.clear_cookies()
    thief.add_cookies(copied)
    page.goto(f"{CONSOLE_URL}/approvals")
    expect(page).to_have_url(re.compile(r"/login\?next="))
    thief.clear_cookies()
    thief.add_cookies(copied)
    answer = thief.request.post(
        f"{CONSOLE_URL}/approvals/00000000-0000-0000-0000-000000000000/approve",
        form={"csrf": csrf or "", "digest": "sha256:" + "0" * 64},
        max_redirects=0,
    )
    assert answer.status == 403 and "CSRF" in answer.text()
    thief.close()
    alice.context.close()  # type: ignore[attr-defined]
