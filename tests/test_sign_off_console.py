"""The approver's console queue (/admin/sign-offs/): the pending requests the signed-in account may decide, with
the arguments as the upstream will receive them (escaped: they are the caller's text), and their decision, made
here or in the REST API only; the list refreshes itself. And the Rule admin's sign-off fields."""

import re
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx2
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from mcp.shared.exceptions import MCPError

from audit.models import AuditEvent
from policy.decisions import SignOffTerms
from policy.models import Rule, SignOff, Team, TeamMember, default_team
from policy.sign_off import sign_off_settle
from tests.clients import call
from tests.factories import agent, team
from tests.helpers import audit_mark, audit_since, run
from tests.test_console_browser import PASSWORD, signed_in
from tests.test_sign_off import (  # noqa: F401 (fixtures)
    approver,
    asked_for,
    asking,
    pending_call,
    sign_off_rule,
    waiting,
)

QUEUE = "/admin/sign-offs/"
LIVE = "/admin/sign-offs/live/"


@pytest.fixture
def queue(approver) -> Iterator[tuple[Client, Group, SignOff]]:  # noqa: F811
    """ann, staff and in the console group `approvers`, on the test client; one request she may decide."""
    ann, group = approver
    ann.is_staff = True
    ann.save()
    terms = SignOffTerms(1, 1, group.id, False, 60.0, 60.0, False)
    with agent("queue-dora") as (dora, _key):
        arguments = {"note": "<script>alert('owned')</script>", "amount": 900}
        pending = sign_off_settle(asking(dora.id, arguments, terms, issuer="https://idp", subject="dora")).sign_off
        client = Client()
        client.force_login(ann)
        yield client, group, pending


def decide(client: Client, sign_off: SignOff | str, decision: str, reason: str = "") -> list[str]:
    """Post a decision as the page's form does; the messages the queue then shows."""
    form = {"sign_off": str(getattr(sign_off, "id", sign_off)), "decision": decision, "reason": reason}
    page = client.post(QUEUE, form, follow=True)
    assert page.redirect_chain == [(QUEUE, 302)]
    return [str(message) for message in page.context["messages"]]


def test_the_queue_lists_the_requests_the_approver_may_decide_with_their_arguments_escaped(queue):
    client, group, pending = queue
    with agent("queue-eli") as (eli, _key):
        own = sign_off_settle(asking(eli.id, {"a": 1})).sign_off  # signed off by the caller only: not ann's
        page = client.get(QUEUE)
    html = page.content.decode()
    assert page.status_code == 200
    assert f'id="sign-off-{pending.id}"' in html and f'id="sign-off-{own.id}"' not in html
    assert "&lt;script&gt;alert(&#x27;owned&#x27;)&lt;/script&gt;" in html and "<script>alert" not in html
    assert "&quot;amount&quot;: 900" in html and pending.arguments_sha256 in html
    assert "queue-dora" in html and "dora at https://idp" in html and "demo__add" in html
    assert "rule 1</a>" not in html and "rule 1, version 1" in html  # ann may not open rules: no link
    assert 'name="csrfmiddlewaretoken"' in html and "/static/policy/sign_offs." in html
    live = client.get(LIVE).content.decode()
    assert f'data-sign-off="{pending.id}"' in live and "<html" not in live


@contextmanager
def console_member(name: str, team: Team, groups: tuple[Group, ...] = ()) -> Iterator[Client]:
    """A staff account, `admin` of `team` and in `groups`, signed in on the test client."""
    user = get_user_model().objects.create_user(name, is_staff=True)
    try:
        user.groups.set(groups)
        TeamMember.objects.create(team=team, user=user, role="admin")
        client = Client()
        client.force_login(user)
        yield client
    finally:
        user.delete()


def test_an_approver_of_another_team_sees_no_request_and_cannot_decide_one(queue):
    _client, group, pending = queue
    with team("queue-other") as other, console_member("queue-bob", other, (group,)) as bob:
        assert "No request waits for you." in bob.get(QUEUE).content.decode()
        assert f"sign-off-{pending.id}" not in bob.get(LIVE).content.decode()
        assert decide(bob, pending, "grant") == [f"No sign-off request {str(pending.id)!r}."]
    pending.refresh_from_db()
    assert pending.state == "pending"


def test_a_decision_by_someone_outside_the_console_group_is_refused_with_the_exact_message(queue):
    _client, _group, pending = queue
    with console_member("queue-cleo", Team.objects.get(pk=pending.team_id)) as cleo:
        assert "No request waits for you." in cleo.get(QUEUE).content.decode()
        refused = decide(cleo, pending, "grant")
    assert refused == ["Only members of the console group 'approvers' may sign off this call."]
    pending.refresh_from_db()
    assert pending.state == "pending"


def test_a_refusal_must_say_why_and_is_audited_with_the_approver_and_the_reason(queue):
    client, _group, pending = queue
    assert decide(client, pending, "refuse", "  ") == ["Say why you refuse: the caller is told."]
    mark = audit_mark()
    assert decide(client, pending, "refuse", "Not on a Friday.") == [
        "Refused demo__add for dora: the caller is told why."
    ]
    [row] = audit_since(mark)
    assert (row.kind, row.actor, row.detail["reason"]) == ("signoff_refused", "ann", "Not on a Friday.")
    assert f"sign-off-{pending.id}" not in client.get(LIVE).content.decode()
    assert decide(client, pending, "grant") == ["This request was already refused by ann."]


def test_a_grant_writes_its_audit_row_naming_the_approver_and_drops_the_arguments(queue):
    client, _group, pending = queue
    mark = audit_mark()
    assert decide(client, pending, "grant") == ["Signed off demo__add for dora: its next identical call runs."]
    [row] = audit_since(mark)
    assert (row.kind, row.actor, row.detail["sign_off"]) == ("signoff_granted", "ann", str(pending.id))
    assert (row.arguments_sha256, row.person_subject) == (pending.arguments_sha256, "dora")
    pending.refresh_from_db()
    assert (pending.state, pending.decided_by, pending.arguments) == ("granted", "ann", None)


def test_a_decision_the_form_does_not_carry_is_refused_and_nothing_changes(queue):
    client, _group, pending = queue
    assert decide(client, pending, "maybe") == [
        "This decision was not understood (decision: Select a valid choice. maybe is not one of the available "
        "choices.)."
    ]
    assert decide(client, str(uuid.uuid4()) + "x", "grant")[0].startswith("No sign-off request ")
    pending.refresh_from_db()
    assert pending.state == "pending"


def test_the_queue_asks_a_visitor_to_sign_in_first(db):
    for page in (QUEUE, LIVE):
        answer = Client().get(page)
        assert answer.status_code == 302 and answer["Location"].startswith("/admin/login/")


def test_the_rule_form_holds_the_sign_off_fields_and_lists_console_groups_as_signers(admin_client, approver):  # noqa: F811
    _ann, group = approver
    html = admin_client.get("/admin/policy/rule/add/").content.decode()
    assert "Sign-off: a sign_off rule only" in html and 'name="tool_class"' in html
    assert f'<option value="{group.pk}">approvers</option>' in html
    form = {"effect": "sign_off", "tool_pattern": "*", "tool_class": "destructive", "signers": group.pk,
            "four_eyes": "on", "sign_off_wait": "120", "enabled": "on", "team": default_team(),
            "note": "two people"}  # fmt: skip
    saved = admin_client.post("/admin/policy/rule/add/", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    made = Rule.objects.get(note="two people")
    assert (made.signers, made.four_eyes, made.sign_off_wait, made.tool_class) == (group, True, 120, "destructive")


# Through a live gateway: over HTTP (the page's own requests, with its CSRF tokens), and in Chromium


def staff_approver() -> None:
    """ann (the `approver` fixture's) made console staff with a password, as console sign-in makes a team member."""
    ann = get_user_model().objects.get(username="ann")
    ann.is_staff = True
    ann.set_password(PASSWORD)
    ann.save()


def csrf_of(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)[1]


def test_over_http_the_live_list_shows_a_new_request_whose_sign_off_lets_the_call_run(inline_gateway, sign_off_rule):  # noqa: F811
    _carol, key, _made = sign_off_rule
    staff_approver()
    with httpx2.Client(base_url=inline_gateway.url, timeout=10, follow_redirects=True) as http:
        login = http.get(f"/admin/login/?next={QUEUE}")
        form = {"username": "ann", "password": PASSWORD, "next": QUEUE, "csrfmiddlewaretoken": csrf_of(login.text)}
        page = http.post(f"/admin/login/?next={QUEUE}", data=form)
        assert (page.url.path, "No request waits for you." in page.text) == (QUEUE, True)
        script = re.search(r'src="(/static/policy/sign_offs\.[0-9a-f]+\.js)"', page.text)[1]
        assert "setInterval" in http.get(script).text
        ident = pending_call(inline_gateway, key, {"a": 1, "b": 2}).data["signOffId"]
        live = http.get(LIVE).text
        assert f'data-sign-off="{ident}"' in live
        decision = {"sign_off": ident, "decision": "grant", "reason": "", "csrfmiddlewaretoken": csrf_of(live)}
        decided = http.post(QUEUE, data=decision)
        assert "Signed off demo__add for signoff-carol: its next identical call runs." in decided.text
        assert f'data-sign-off="{ident}"' not in decided.text
    result = run(lambda: call(inline_gateway.url, key, "demo__add", {"a": 1, "b": 2}))
    assert result.content[0].text == "3"


def asked_call(gateway, key: str, era: str, arguments: dict) -> Callable[[], Any]:
    """The agent's call in `era`, asked for; then its answer once decided: a 2025-11-25 call waits within its
    request (in a thread of its own), a 2026-07-28 one is told to come back and is made again."""
    if era == "legacy":
        answer = waiting(gateway, key, arguments)
        return lambda: answer.result(timeout=30)
    pending_call(gateway, key, arguments)
    return lambda: run(lambda: call(gateway.url, key, "demo__add", arguments, mode=era))


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
def test_in_chromium_an_approver_sees_new_requests_appear_signs_one_off_and_refuses_one_with_a_reason(
    gateway,
    sign_off_rule,  # noqa: F811
    browser,
    era,
):
    carol, key, _made = sign_off_rule
    staff_approver()
    # This thread holds Playwright's event loop: the agent's calls run in threads of their own.
    with ThreadPoolExecutor(1) as thread:
        warm = thread.submit(pending_call, gateway, key, {"a": 0, "b": 0}).result()  # the gateway saw the rule
        SignOff.objects.filter(pk=warm.data["signOffId"]).delete()  # and the queue starts empty
        with signed_in(browser, gateway.url, "ann", ready="#sign-offs-link") as page:
            page.click("#sign-offs-link")
            page.wait_for_selector("#sign-off-none")
            answer = thread.submit(asked_call, gateway, key, era, {"a": 20, "b": 22}).result()
            ident = str(asked_for(carol, {"a": 20, "b": 22}).id)
            item = page.wait_for_selector(f"#sign-off-{ident}")  # no reload: the list refreshed itself
            assert '"a": 20' in item.inner_text() and page.locator("#sign-off-none").count() == 0
            mark = audit_mark()
            page.click(f"#sign-off-{ident} .sign-off-grant")
            message = page.wait_for_selector(".messagelist .success").inner_text()
            assert message == "Signed off demo__add for signoff-carol: its next identical call runs."
            result = thread.submit(answer).result()
            assert not isinstance(result, MCPError) and result.content[0].text == "42"
            refused = thread.submit(asked_call, gateway, key, era, {"a": 1, "b": 1}).result()
            other = str(asked_for(carol, {"a": 1, "b": 1}).id)
            page.wait_for_selector(f"#sign-off-{other}")
            page.fill(f"#sign-off-{other} input[name=reason]", "Not on a Friday.")
            page.click(f"#sign-off-{other} .sign-off-refuse")
            told = page.wait_for_selector(".messagelist .success:has-text('Refused')").inner_text()
            assert told == "Refused demo__add for signoff-carol: the caller is told why."
            refusal = thread.submit(refused).result()
    assert isinstance(refusal, MCPError) and (refusal.code, refusal.data["code"]) == (-32001, "SIGNOFF_REFUSED")
    assert (
        str(refusal) == "ann refused to sign off this call of 'demo__add': Not on a Friday. Do not retry it unchanged."
    )
    kinds = [(row.kind, row.actor, row.detail.get("sign_off")) for row in audit_since(mark)]
    assert ("signoff_granted", "ann", ident) in kinds and ("completed", "", ident) in kinds
    assert ("signoff_refused", "ann", other) in kinds and ("denied", "", other) in kinds
    assert AuditEvent.objects.get(id__gt=mark, kind="approved").detail["sign_off"] == ident


def test_the_dashboard_counts_the_calls_waiting_for_sign_off_the_oldest_wait_and_the_decisions_time(
    queue, admin_client
):
    client, group, pending = queue
    SignOff.objects.filter(pk=pending.pk).update(asked_at=pending.asked_at - timedelta(minutes=5))
    with agent("queue-fay") as (fay, _key):
        decided = sign_off_settle(asking(fay.id, {"a": 2}, SignOffTerms(1, 1, group.id, False, 60.0, 60.0, False)))
        SignOff.objects.filter(pk=decided.sign_off.pk).update(
            state="granted", decided_at=decided.sign_off.asked_at + timedelta(seconds=42)
        )
        page = admin_client.get("/admin/dashboard/").content.decode()
        other = SignOff.objects.exclude(pk__in=[pending.pk, decided.sign_off.pk]).filter(state="pending").count()
    tile = re.search(r'<a class="tile warn" href="/admin/sign-offs/" id="sign-offs">(.*?)</a>', page, re.S)
    assert tile, page
    assert f'<strong id="sign-offs-pending">{1 + other}</strong> calls waiting for sign-off' in tile.group(1)
    assert "<small>the oldest for 5\xa0minutes</small>" in tile.group(1)
    assert "<small>decided in 42 s (median, a day)</small>" in tile.group(1)
