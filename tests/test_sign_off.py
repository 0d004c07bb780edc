"""Sign-off: a sign-off rule lets a call run only once a person signed off this very call (its caller, tool,
arguments by their RFC 8785 digest, the rule's version and the tool's definition), once. The call is asked for and
told to come back (-32003 SIGNOFF_PENDING); approvers decide through the REST API; every step has its audit row."""

import json
import unicodedata
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

import anyio
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.http import HttpResponse
from django.test import Client
from django.utils import timezone
from mcp import InputRequiredRoundsExceededError, UrlElicitationRequiredError, types
from mcp.shared.exceptions import MCPError

from audit.models import DEFAULT_TEAM, AuditEvent
from policy.decisions import READ_ONLY, UNSAID, WRITES, CompiledRule, Policy, SignOffTerms, Target, tool_classes
from policy.models import Person, Rule, SignOff, Team, TeamMember
from policy.services import admin_token_issue, agent_key_issue
from policy.sign_off import (
    Asking,
    Binding,
    SignOffRefused,
    arguments_digest,
    sign_off_decide,
    sign_off_settle,
    sign_offs_expire,
)
from registry.models import Upstream
from tests.clients import api, call, sdk_client, tool_names
from tests.factories import agent, team
from tests.helpers import audit_mark, audit_since, eventually, run

TERMS = SignOffTerms(rule_id=1, rule_version=1, signers=None, four_eyes=False, wait=60.0, valid=60.0, by_form=False)
TARGET = Target("demo__add", "demo", True, True, upstream_id=1, tool="add")


# The decision


def rule(*, allow: bool = True, sign_off: SignOffTerms | None = None, tool_class: str = "", rule_id: int = 1):
    return CompiledRule.build(
        allow=allow, agents=None, upstream_id=None, server_group_id=None, tool_pattern="*", rule_id=rule_id,
        tool_class=tool_class, sign_off=sign_off,
    )  # fmt: skip


def test_a_sign_off_rule_also_grants_deny_still_wins_and_it_wins_over_an_allow():
    asks = rule(sign_off=TERMS, rule_id=2)
    granted = Policy(rules=(asks,), default_allow=False).grounds(1, TARGET)
    assert (granted.allow, granted.rule_id, granted.sign_off) == (True, 2, TERMS)
    assert granted.detail() == {"rule": 2, "note": "", "effect": "sign_off"}
    denied = Policy(rules=(asks, rule(allow=False, rule_id=3))).grounds(1, TARGET)
    assert (denied.allow, denied.rule_id, denied.sign_off) == (False, 3, None)
    over_allow = Policy(rules=(rule(rule_id=4), asks)).grounds(1, TARGET)
    assert (over_allow.rule_id, over_allow.sign_off) == (2, TERMS)


def test_tools_are_matched_by_their_annotations_and_one_with_none_is_taken_as_destructive():
    assert tool_classes(None) == tool_classes({}) == UNSAID == {"writes", "destructive", "unannotated"}
    assert tool_classes({"readOnlyHint": True}) == {READ_ONLY}
    assert tool_classes({"readOnlyHint": False, "destructiveHint": False}) == {WRITES}
    assert tool_classes({"title": "Add"}) == {"writes", "destructive"}
    destructive = Policy(rules=(rule(sign_off=TERMS, tool_class="destructive"),))
    assert destructive.grounds(1, TARGET).sign_off == TERMS  # no annotations: destructive
    reading = Target("demo__echo", "demo", True, True, upstream_id=1, tool="echo", classes=frozenset({READ_ONLY}))
    assert destructive.grounds(1, reading).sign_off is None


def test_the_arguments_digest_is_rfc_8785_key_order_is_no_change_another_normalisation_is():
    assert arguments_digest({"a": 1, "b": [1.0, "x"]}) == arguments_digest({"b": [1, "x"], "a": 1})
    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert arguments_digest({"name": composed}) != arguments_digest({"name": decomposed})


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"effect": "allow", "four_eyes": True}, "Only a sign-off rule says who signs off and for how long"),
        ({"effect": "sign_off", "four_eyes": True}, "Four eyes needs someone other than the caller"),
        ({"effect": "sign_off", "four_eyes": True, "sign_off_by_form": True, "signers": True}, "never four eyes"),
    ],
)
def test_a_sign_off_rule_that_cannot_work_is_refused(db, fields, error):
    group = Group.objects.create(name="clean-approvers")
    try:
        if fields.pop("signers", False):
            fields["signers"] = group
        with pytest.raises(ValidationError, match=error):
            Rule(**fields).clean()
    finally:
        group.delete()


def test_a_saved_rule_counts_its_versions(db):
    made = Rule.objects.create(effect="sign_off")
    try:
        made.note = "changed"
        made.save()
        assert made.version == 2
    finally:
        made.delete()


# The requests themselves


@pytest.fixture
def approver(db) -> Iterator[tuple[object, Group]]:
    """ann, a member of the default team in the console group `approvers`."""
    group = Group.objects.create(name="approvers")
    ann = get_user_model().objects.create_user("ann", password="pw-for-tests-only")
    ann.groups.add(group)
    TeamMember.objects.create(team=Team.objects.get(slug=DEFAULT_TEAM), user=ann, role="member")
    yield ann, group
    SignOff.objects.all().delete()
    Rule.objects.filter(signers=group).delete()
    ann.delete()
    group.delete()


def asking(agent_id: int, arguments: dict, terms: SignOffTerms = TERMS, **person: str) -> Asking:
    binding = Binding(
        agent_id=agent_id, key_prefix="" if person else "k1", person_issuer=person.get("issuer", ""),
        person_subject=person.get("subject", ""), client_id="", upstream="demo", tool="add",
        arguments_sha256=arguments_digest(arguments), definition_sha256="d" * 64, rule_id=terms.rule_id,
        rule_version=terms.rule_version,
    )  # fmt: skip
    return Asking(
        binding=binding, terms=terms, team_id=Team.objects.get(slug=DEFAULT_TEAM).id, exposed_name="demo__add",
        arguments=arguments, request_id=uuid.uuid4(), audited={"agent_id": agent_id, "agent_name": "x"},
    )  # fmt: skip


def test_decisions_that_may_not_be_made_are_refused_each_with_its_status(approver):
    ann, group = approver
    terms = SignOffTerms(1, 1, group.id, True, 60.0, 60.0, False)
    ivy_account = get_user_model().objects.create_user("ivy-account")
    outsider = get_user_model().objects.create_user("otto")
    person = Person.objects.create(issuer="https://idp", subject="ivy", user=ivy_account)  # signed in to My account
    try:
        with agent("signoff-ivy") as (ivy, _key):
            pending = sign_off_settle(asking(ivy.id, {"a": 1}, terms, issuer="https://idp", subject="ivy")).sign_off
            assert pending.caller_user_id == ivy_account.pk
            with pytest.raises(SignOffRefused, match="No sign-off request 'nope'") as missing:
                sign_off_decide(sign_off_id="nope", user=ann, grant=True)
            assert missing.value.status == 404
            with pytest.raises(SignOffRefused, match="No sign-off request") as other_team:
                sign_off_decide(sign_off_id=str(pending.id), user=outsider, grant=True)  # in no team: unknown
            assert other_team.value.status == 404
            TeamMember.objects.create(team=pending.team, user=outsider, role="member")
            with pytest.raises(SignOffRefused, match="Only members of the console group 'approvers'") as no_group:
                sign_off_decide(sign_off_id=str(pending.id), user=outsider, grant=True)
            assert no_group.value.status == 403
            ivy_account.groups.add(group)  # the caller is an approver too, but four eyes are asked
            TeamMember.objects.create(team=pending.team, user=ivy_account, role="member")
            with pytest.raises(SignOffRefused, match="four eyes: someone other than the caller") as own:
                sign_off_decide(sign_off_id=str(pending.id), user=ivy_account, grant=True)
            assert own.value.status == 403
            with pytest.raises(SignOffRefused, match="Say why you refuse") as unexplained:
                sign_off_decide(sign_off_id=str(pending.id), user=ann, grant=False)
            assert unexplained.value.status == 400
            sign_off_decide(sign_off_id=str(pending.id), user=ann, grant=False, reason="not today")
            with pytest.raises(SignOffRefused, match="This request was already refused by ann.") as twice:
                sign_off_decide(sign_off_id=str(pending.id), user=ann, grant=True)
            assert twice.value.status == 409
    finally:
        person.delete()
        ivy_account.delete()
        outsider.delete()


def test_a_request_past_its_wait_expires_with_its_row_and_can_no_longer_be_decided(approver):
    ann, group = approver
    terms = SignOffTerms(1, 1, group.id, False, 60.0, 60.0, False)
    with agent("signoff-jo") as (jo, _key):
        pending = sign_off_settle(asking(jo.id, {"a": 2}, terms)).sign_off
        SignOff.objects.filter(pk=pending.pk).update(wait_until=timezone.now() - timedelta(seconds=1))
        mark = audit_mark()
        with pytest.raises(SignOffRefused, match="This request expired before it was decided.") as late:
            sign_off_decide(sign_off_id=str(pending.id), user=ann, grant=True)
        assert late.value.status == 409
        [row] = audit_since(mark)
        assert (row.kind, row.detail) == ("signoff_expired", {"sign_off": str(pending.id), "was": "pending"})
        pending.refresh_from_db()
        assert (pending.state, pending.arguments) == ("expired", None)


def test_a_grant_no_call_used_in_time_is_not_taken_and_the_sweep_expires_it(approver):
    ann, group = approver
    terms = SignOffTerms(1, 1, group.id, False, 60.0, 60.0, False)
    with agent("signoff-kim") as (kim, _key):
        asked = asking(kim.id, {"a": 3}, terms)
        pending = sign_off_settle(asked).sign_off
        sign_off_decide(sign_off_id=str(pending.id), user=ann, grant=True)
        SignOff.objects.filter(pk=pending.pk).update(usable_until=timezone.now() - timedelta(seconds=1))
        again = sign_off_settle(asked)
        assert (again.state, again.sign_off.id) == ("pending", again.sign_off.id)
        assert again.sign_off.id != pending.id  # asked anew, the stale grant untouched
        mark = audit_mark()
        assert sign_offs_expire() == 1
        assert [(r.kind, r.detail["was"]) for r in audit_since(mark)] == [("signoff_expired", "granted")]


def test_a_flood_of_calls_needing_sign_off_is_bounded_per_caller(approver, settings):
    settings.GATEWAY_SIGN_OFF_PENDING_PER_CALLER = 3
    with agent("signoff-lee") as (lee, _key), agent("signoff-max") as (other, _key2):
        states = [sign_off_settle(asking(lee.id, {"a": n})).state for n in range(5)]
        assert states == ["pending", "pending", "pending", "busy", "busy"]
        assert sign_off_settle(asking(lee.id, {"a": 0})).state == "pending"  # the same call joins its request
        assert sign_off_settle(asking(other.id, {"a": 9})).state == "pending"  # another caller is not held


# End to end: an agent's calls through the gateway, an approver through the REST API


@pytest.fixture
def sign_off_rule(approver, world) -> Iterator[tuple[object, str, Rule]]:
    ann, group = approver
    with agent("signoff-carol") as (carol, key):
        made = Rule.objects.create(
            effect="sign_off", agent=carol, upstream=Upstream.objects.get(slug="demo"), tool_pattern="add",
            signers=group,
        )  # fmt: skip
        yield carol, key, made


def pending_call(gateway, key: str, arguments: dict) -> MCPError:
    """A 2026-07-28 call (told at once, never held), once the gateway has seen the agent and rule: pending."""

    def refused() -> MCPError | None:
        answer = run(lambda: call(gateway.url, key, "demo__add", arguments, mode="2026-07-28"))
        pending = isinstance(answer, MCPError) and (answer.data or {}).get("code") == "SIGNOFF_PENDING"
        return answer if pending else None  # else the gateway has not seen the new agent or rule yet

    return eventually(refused)


def ann_token() -> str:
    return admin_token_issue(user=get_user_model().objects.get(username="ann"), actor="tests")


def asked_for(carol, arguments: dict, *, besides: tuple[str, ...] = ()) -> SignOff:
    """The pending request of this call, once the gateway has asked for it."""
    digest = arguments_digest(arguments)
    found = SignOff.objects.filter(agent=carol, arguments_sha256=digest, state="pending").exclude(pk__in=besides)
    return eventually(lambda: found.first())


def waiting(gateway, key: str, arguments: dict, progress: list | None = None) -> Future:
    """A 2025-11-25 call in the background: it waits within its request for the decision."""

    async def scenario():
        async def noted(done: float, total: float | None, message: str | None) -> None:
            progress.append(message)

        async with sdk_client(gateway.url, key, "legacy") as client:
            try:
                return await client.call_tool(
                    "demo__add", arguments, progress_callback=noted if progress is not None else None
                )
            except MCPError as refused:
                return refused

    return ThreadPoolExecutor(1).submit(run, scenario)


def test_ask_sign_off_run_then_a_replay_and_a_changed_argument_are_asked_again_2026(gateway, sign_off_rule):
    carol, key, made = sign_off_rule
    token = ann_token()
    mark = audit_mark()
    asked = pending_call(gateway, key, {"a": 2, "b": 3})
    ident = asked.data["signOffId"]
    assert asked.code == -32003 and 0 < asked.data["retryAfter"] <= 10
    assert str(asked).startswith(
        f"'demo__add' runs only once a person signs off this very call. It is asked for (sign-off request {ident})"
    )
    modern = "2026-07-28"
    joined = run(lambda: call(gateway.url, key, "demo__add", {"b": 3, "a": 2}, mode=modern))  # key order: same call
    assert joined.data["signOffId"] == ident
    listed = api(gateway, "GET", "signoffs", token).json()
    assert [(s["id"], s["arguments"], s["tool"], s["signers"]) for s in listed] == [
        (ident, {"a": 2, "b": 3}, "add", "approvers")
    ]
    granted = api(gateway, "POST", f"signoffs/{ident}/grant", token, json={"reason": "fine"})
    assert granted.status_code == 200 and granted.json()["state"] == "granted"
    assert granted.json()["arguments"] is None  # kept only until decided
    result = run(lambda: call(gateway.url, key, "demo__add", {"a": 2, "b": 3}, mode=modern))
    assert not isinstance(result, MCPError), result
    assert result.content[0].text == "5"
    replay = run(lambda: call(gateway.url, key, "demo__add", {"a": 2, "b": 3}, mode=modern))
    assert replay.data["code"] == "SIGNOFF_PENDING" and replay.data["signOffId"] != ident  # used once
    changed = run(lambda: call(gateway.url, key, "demo__add", {"a": 2, "b": 4}, mode=modern))
    assert changed.data["signOffId"] not in (ident, replay.data["signOffId"])
    rows = [(r.kind, r.error_code, r.detail.get("sign_off"), r.actor) for r in audit_since(mark)]
    assert len([row for row in rows if row[0] == "signoff_asked"]) == 3
    assert ("denied", "SIGNOFF_PENDING", ident, "") in rows
    assert ("signoff_granted", "", ident, "ann") in rows
    assert ("approved", "", ident, "") in rows and ("completed", "", ident, "") in rows
    approved = AuditEvent.objects.get(id__gt=mark, kind="approved", detail__sign_off=ident)
    assert approved.arguments_sha256 and approved.agent_name == "signoff-carol"


def test_a_2025_session_waits_for_the_sign_off_with_progress_and_runs_at_once(gateway, sign_off_rule):
    carol, key, made = sign_off_rule
    token = ann_token()
    pending_call(gateway, key, {"a": 0, "b": 0})  # the gateway has seen the rule
    progress: list[str] = []
    call_made = waiting(gateway, key, {"a": 4, "b": 5}, progress)
    ident = str(asked_for(carol, {"a": 4, "b": 5}).id)
    eventually(lambda: progress)  # told it waits, while it waits
    assert progress[0] == f"Waiting for a person to sign off this call (request {ident})."
    assert api(gateway, "POST", f"signoffs/{ident}/grant", token, json={}).status_code == 200
    result = call_made.result(timeout=30)
    assert not isinstance(result, MCPError), result
    assert result.content[0].text == "9"
    assert AuditEvent.objects.filter(kind="completed", detail__sign_off=ident).count() == 1
    replay = waiting(gateway, key, {"a": 4, "b": 5})  # the grant is used: the same call asks again
    again = asked_for(carol, {"a": 4, "b": 5}, besides=(ident,))
    refused = api(gateway, "POST", f"signoffs/{again.id}/refuse", token, json={"reason": "Once is enough."})
    assert refused.status_code == 200
    answer = replay.result(timeout=30)
    assert isinstance(answer, MCPError) and answer.data["code"] == "SIGNOFF_REFUSED"
    assert str(answer) == "ann refused to sign off this call of 'demo__add': Once is enough. Do not retry it unchanged."


def test_a_refused_call_is_told_who_refused_and_why(gateway, sign_off_rule):
    carol, key, made = sign_off_rule
    token = ann_token()
    ident = pending_call(gateway, key, {"a": 7, "b": 7}).data["signOffId"]
    unexplained = api(gateway, "POST", f"signoffs/{ident}/refuse", token, json={})
    assert (unexplained.status_code, unexplained.json()) == (400, {"detail": "Say why you refuse: the caller is told."})
    refused = api(gateway, "POST", f"signoffs/{ident}/refuse", token, json={"reason": "Not on a Friday."})
    assert refused.status_code == 200 and refused.json()["state"] == "refused"
    answer = run(lambda: call(gateway.url, key, "demo__add", {"a": 7, "b": 7}))  # 2025-11-25: told at once
    assert answer.code == -32001 and answer.data == {
        "code": "SIGNOFF_REFUSED", "signOffId": ident, "requestId": answer.data["requestId"]
    }  # fmt: skip
    assert str(answer) == (
        "ann refused to sign off this call of 'demo__add': Not on a Friday. Do not retry it unchanged."
    )
    again = api(gateway, "POST", f"signoffs/{ident}/grant", token, json={})
    assert (again.status_code, again.json()) == (409, {"detail": "This request was already refused by ann."})
    missing = api(gateway, "POST", f"signoffs/{uuid.uuid4()}/grant", token, json={})
    assert missing.status_code == 404


def test_a_request_no_one_decides_expires_and_the_waiting_call_is_told(inline_gateway, sign_off_rule):
    carol, key, made = sign_off_rule
    made.sign_off_wait = 2
    made.save()
    pending_call(inline_gateway, key, {"a": 0, "b": 1})  # the gateway has seen the rule's new version
    mark = audit_mark()
    answer = waiting(inline_gateway, key, {"a": 1, "b": 2}).result(timeout=30)
    assert isinstance(answer, MCPError) and (answer.code, answer.data["code"]) == (-32001, "SIGNOFF_EXPIRED")
    ident = answer.data["signOffId"]
    assert str(answer) == (
        f"No one signed off this call of 'demo__add' in time: its request ({ident}) expired. Make the call again "
        "to ask anew, or tell the user someone must sign it off."
    )
    # This request's rows: the first call's request, as short-lived, may expire meanwhile with a row of its own.
    kinds = [(r.kind, r.error_code) for r in audit_since(mark) if r.detail.get("sign_off", ident) == ident]
    assert kinds == [("signoff_asked", ""), ("signoff_expired", ""), ("denied", "SIGNOFF_EXPIRED")]


def test_an_approver_of_another_team_neither_sees_nor_decides_a_request(inline_gateway, sign_off_rule):
    carol, key, made = sign_off_rule
    ident = pending_call(inline_gateway, key, {"a": 1, "b": 1}).data["signOffId"]
    with team("signoff-other") as other:
        bob = get_user_model().objects.create_user("bob-approver")
        try:
            bob.groups.add(made.signers)
            TeamMember.objects.create(team=other, user=bob, role="admin")
            token = admin_token_issue(user=bob, actor="tests")
            assert api(inline_gateway, "GET", "signoffs", token).json() == []
            shown = api(inline_gateway, "GET", f"signoffs/{ident}", token)
            assert (shown.status_code, shown.json()) == (404, {"detail": f"No sign-off request {ident!r}."})
            decided = api(inline_gateway, "POST", f"signoffs/{ident}/grant", token, json={})
            assert decided.status_code == 404
        finally:
            bob.delete()
    assert SignOff.objects.get(pk=ident).state == "pending"


def test_inside_code_mode_a_call_needing_sign_off_fails_at_once_naming_its_request(gateway, sign_off_rule):
    carol, key, made = sign_off_rule
    pending_call(gateway, key, {"a": 0, "b": 0})  # the gateway has seen the rule
    code = """
        try { return await tools.demo.add({ a: 5, b: 6 }); }
        catch (e) { return [e.name, e.code, e.message]; }
    """
    result = run(lambda: call(gateway.url, key, "switchboard__execute", {"code": code}))
    name, code_of, message = json.loads(result.content[0].text)
    ident = str(asked_for(carol, {"a": 5, "b": 6}).id)
    assert (name, code_of) == ("MCPToolError", "SIGNOFF_REQUIRED")
    assert message == (
        f"'demo__add' runs only once a person signs off this very call; it is asked for (sign-off request {ident})."
        " Code cannot wait for it: call the tool directly, with the same arguments, once signed off."
    )


def test_a_specialists_call_during_a_handoff_needs_sign_off_too(inline_gateway, specialists, approver):
    ann, group = approver
    finance = Upstream.objects.get(slug="finance")
    with agent("signoff-handed") as (handed, key):
        Rule.objects.create(
            effect="sign_off", agent=handed, upstream=finance, tool_pattern="handoff_context", signers=group
        )
        eventually(lambda: "switchboard__handoff_to_finance" in run(lambda: tool_names(inline_gateway.url, key)))

        async def scenario():
            async with sdk_client(inline_gateway.url, key, "legacy") as client:
                await client.call_tool("switchboard__handoff_to_finance", {"reason": "a refund"})
                return await client.call_tool("finance__handoff_context", {})

        held = ThreadPoolExecutor(1).submit(run, scenario)
        asked = eventually(lambda: SignOff.objects.filter(agent=handed, state="pending").first())
        assert (asked.upstream, asked.tool, asked.exposed_name) == (
            "finance",
            "handoff_context",
            "finance__handoff_context",
        )
        assert api(inline_gateway, "POST", f"signoffs/{asked.id}/grant", ann_token(), json={}).status_code == 200
        result = held.result(timeout=30)
    assert not result.is_error and "refund" in result.content[0].text
    assert AuditEvent.objects.filter(kind="completed", detail__sign_off=str(asked.id), upstream="finance").count() == 1


# The caller signs off themself: a link, opened by URL elicitation where the client declared it


@pytest.fixture
def own_sign_off(gateway, world) -> Iterator[tuple[object, str]]:
    """pat, who calls with a personal key (its owner is the person), under a rule that pat signs off alone."""
    pat = get_user_model().objects.create_user("pat-self", first_name="Pat")
    with agent("signoff-own") as (own, _agent_key):
        key = agent_key_issue(agent=own, owner=pat, actor="tests").key
        demo = Upstream.objects.get(slug="demo")
        Rule.objects.create(effect="sign_off", agent=own, upstream=demo, tool_pattern="add")
        pending_call(gateway, key, {"a": 0, "b": 0})  # the gateway has seen the agent and the rule
        yield pat, key
        SignOff.objects.filter(agent=own).delete()
    pat.delete()


def signed_off_by(user, ident: str, decision: str = "grant", reason: str = "") -> HttpResponse:
    browser = Client()
    browser.force_login(user)
    return browser.post(f"/account/sign-offs/{ident}/", {"decision": decision, "reason": reason})


def test_a_2025_client_is_sent_to_sign_off_its_own_call_and_its_retry_runs(gateway, own_sign_off):
    pat, key = own_sign_off

    async def elicited(context, params):  # declares URL-mode elicitation; a 2025-11-25 session is told by -32042
        raise AssertionError("not asked at 2025-11-25")

    async def scenario():
        async with sdk_client(gateway.url, key, "legacy", elicitation_callback=elicited) as client:
            try:
                await client.call_tool("demo__add", {"a": 20, "b": 22})
            except MCPError as asked:
                return asked

    asked = run(scenario)
    assert asked.error.code == -32042
    (elicitation,) = UrlElicitationRequiredError.from_error(asked.error).elicitations
    ident = elicitation.url.rstrip("/").rsplit("/", 1)[1]
    assert elicitation.url == f"{gateway.url}/account/sign-offs/{ident}/"
    assert elicitation.message.startswith(
        f"'demo__add' runs only once you sign off this very call: open {elicitation.url}"
    )
    stranger = get_user_model().objects.create_user("stranger")
    try:
        browser = Client()
        browser.force_login(stranger)
        page = browser.get(f"/account/sign-offs/{ident}/")
        assert page.status_code == 403 and b"Only the person who made this call may sign it off." in page.content
        assert b'id="arguments"' not in page.content and b"demo__add" not in page.content  # nor what was called
    finally:
        stranger.delete()
    own = Client()
    own.force_login(pat)
    shown = own.get(f"/account/sign-offs/{ident}/")
    assert shown.status_code == 200 and b"&quot;a&quot;: 20" in shown.content  # escaped: untrusted text
    granted = signed_off_by(pat, ident)
    assert granted.status_code == 200 and b"This request is granted by pat-self." in granted.content
    result = run(lambda: call(gateway.url, key, "demo__add", {"a": 20, "b": 22}))
    assert not isinstance(result, MCPError) and result.content[0].text == "42"


def test_a_2026_client_is_asked_by_url_elicitation_and_its_retry_runs_once_signed_off(gateway, own_sign_off):
    pat, key = own_sign_off
    asked: list = []

    async def elicited(context, params):
        asked.append(params.url)
        ident = params.url.rstrip("/").rsplit("/", 1)[1]
        reply = await anyio.to_thread.run_sync(signed_off_by, pat, ident)
        assert reply.status_code == 200
        return types.ElicitResult(action="accept")

    async def scenario():
        async with sdk_client(gateway.url, key, "2026-07-28", elicitation_callback=elicited) as client:
            return await client.call_tool("demo__add", {"a": 1, "b": 41})

    result = run(scenario)
    assert result.content[0].text == "42"
    assert asked[-1].startswith(f"{gateway.url}/account/sign-offs/")


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])  # a question within the request, or an input-required round
@pytest.mark.parametrize(("action", "text"), [("accept", "42"), ("decline", None)])
def test_where_the_rule_allows_the_client_answers_a_form_and_it_is_audited_as_such(
    gateway, own_sign_off, action, text, era
):
    pat, key = own_sign_off
    rule = Rule.objects.get(agent__name="signoff-own")
    rule.sign_off_by_form = True
    rule.save()
    asked: list[str] = []

    async def answered(context, params):
        asked.append(params.message)
        return types.ElicitResult(action=action, content={"reason": "no"} if action == "decline" else None)

    async def scenario():
        async with sdk_client(gateway.url, key, era, elicitation_callback=answered) as client:
            try:
                return await client.call_tool("demo__add", {"a": 40, "b": 2})
            except MCPError as refused:
                return refused
            except InputRequiredRoundsExceededError:  # asked for the link until the gateway has seen the change
                return None

    mark = audit_mark()
    answer = eventually(lambda: (found := run(scenario)) and asked and found, timeout=20)  # rounds until it sees it
    assert (
        asked[-1]
        == 'Sign off this call of \'demo__add\' with {"a": 40, "b": 2}? Accept runs it, once; decline refuses it.'
    )
    decided = [r for r in audit_since(mark) if r.kind in ("signoff_granted", "signoff_refused")][-1]
    assert (decided.actor, decided.detail["by"]) == ("", "form")
    if text:
        assert answer.content[0].text == text and decided.kind == "signoff_granted"
    else:
        assert answer.data["code"] == "SIGNOFF_REFUSED" and str(answer).startswith(
            "Pat (a form in their client) refused"
        )
