# ruff: noqa: F811 (the fixtures imported from test_sign_off are arguments here)
"""A 2025-11-25 call held for its sign-off (issue 37, scope 3): cancelled by its client, or its session closed, its
wait ends and its request stays pending, for the same call made again to join; one still undecided at the end of
the hold is told -32003 SIGNOFF_PENDING with `retryAfter` and its request; a caller's flood of calls needing
sign-off is told -32003 SIGNOFF_BUSY with `retryAfter` through the gateway; a held call wakes on a decision made in
another web process, and a restart loses no request nor task (scope 6). And in each era on each executor, a
request expires and a call changed after its sign-off is asked again."""

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from mcp.shared.exceptions import MCPError

from audit.models import AuditEvent
from handoff.endpoints.streamable_http.sessions import NOT_FOUND
from policy.models import Rule, SignOff
from registry.models import Upstream
from tests import servers
from tests.clients import api, call, sse_events
from tests.conftest import needs
from tests.factories import agent
from tests.helpers import eventually, run
from tests.test_sign_off import (  # noqa: F401 (fixtures)
    ann_token,
    approver,
    arguments_digest,
    asked_for,
    pending_call,
    sign_off_rule,
    waiting,
)
from tests.test_sign_off_extension_tasks import made as made_task
from tests.test_sign_off_extension_tasks import polled
from tests.test_sign_off_tasks import session

HOLD_SECONDS, PER_CALLER = 1, 2


def held(mcp, arguments: dict[str, Any], request_id: int):
    """A tools/call with a progressToken, its reply read as a stream: held while it waits."""
    params = {"name": "demo__add", "arguments": arguments, "_meta": {"progressToken": request_id}}
    body = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    return mcp.http.stream("POST", mcp.url, json=body)


@pytest.mark.parametrize("ends", ["cancelled", "session closed"])
def test_a_held_call_whose_client_gives_up_leaves_its_request_for_the_same_call_to_join(
    inline_gateway, sign_off_rule, ends
):
    carol, key, made = sign_off_rule
    pending_call(inline_gateway, key, {"a": 0, "b": 0})  # the gateway has seen the rule
    arguments = {"a": 11, "b": 12}
    with session(inline_gateway, key, tasks=False) as mcp, held(mcp, arguments, 50) as waiting:
        ident = str(asked_for(carol, arguments).id)
        if ends == "cancelled":
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 50}}
            assert mcp.http.post(mcp.url, json=cancel).status_code == 202
        else:
            assert mcp.http.delete(mcp.url).status_code in (200, 204)
        told = [event["data"] for event in sse_events(waiting) if "id" in event.get("data", {})]  # then it ends
    assert [answer["error"] for answer in told] == [{"code": -32800, "message": "Request cancelled"}]  # not run
    assert SignOff.objects.get(pk=ident).state == "pending"
    joined = pending_call(inline_gateway, key, arguments)  # the same call again attaches to the open request
    assert joined.data["signOffId"] == ident
    assert api(inline_gateway, "POST", f"signoffs/{ident}/grant", ann_token(), json={}).status_code == 200
    result = run(lambda: call(inline_gateway.url, key, "demo__add", arguments))
    assert not isinstance(result, MCPError) and result.content[0].text == "23"
    assert AuditEvent.objects.filter(kind="completed", detail__sign_off=ident).count() == 1


def test_a_held_call_wakes_on_a_decision_made_in_another_web_process(inline_gateway, celery_gateway, sign_off_rule):
    """State is in the database, wake-ups go through Redis: a call held by one web process runs on a grant another
    one made, long before it would read its request again (RECHECK_SECONDS, 60)."""
    carol, key, made = sign_off_rule
    for gateway in (inline_gateway, celery_gateway):
        pending_call(gateway, key, {"a": 0, "b": 0})  # each has seen the rule
    call_made = waiting(celery_gateway, key, {"a": 3, "b": 4})
    ident = str(asked_for(carol, {"a": 3, "b": 4}).id)
    assert api(inline_gateway, "POST", f"signoffs/{ident}/grant", ann_token(), json={}).status_code == 200
    result = call_made.result(timeout=30)
    assert not isinstance(result, MCPError) and result.content[0].text == "7"


def test_a_restart_loses_no_pending_request_nor_task(server_env, logs, inline_gateway, sign_off_rule):
    """Requests and 2026-07-28 tasks are rows: asked of a web process that then stops, they are decided and served by
    another."""
    carol, key, made = sign_off_rule
    pending_call(inline_gateway, key, {"a": 0, "b": 0})  # the one that stays has seen the rule
    with servers.inline_gateway_with(server_env, logs / "gateway-sign-off-restart.log") as first:
        ident = pending_call(first, key, {"a": 2, "b": 2}).data["signOffId"]
        task = made_task(first, key, {"a": 3, "b": 3})
    tasked = str(asked_for(carol, {"a": 3, "b": 3}).id)
    for asked in (ident, tasked):
        assert api(inline_gateway, "POST", f"signoffs/{asked}/grant", ann_token(), json={}).status_code == 200
    result = run(lambda: call(inline_gateway.url, key, "demo__add", {"a": 2, "b": 2}, mode="2026-07-28"))
    assert not isinstance(result, MCPError) and result.content[0].text == "4"
    assert polled(inline_gateway, key, task["taskId"])["result"]["content"] == [{"type": "text", "text": "6"}]


def test_a_call_needing_sign_off_in_a_session_ended_elsewhere_is_404_and_nobody_is_asked(inline_gateway, sign_off_rule):
    """The process holds the session (it opened it) but the session ended in another one (its record is gone): a call
    that a sign-off rule would hold reads the session before anyone is asked (handoff/mcp/unverified.py)."""
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set: sessions live in one process without it")
    carol, key, made = sign_off_rule
    pending_call(inline_gateway, key, {"a": 0, "b": 0})  # the gateway has seen the rule
    arguments = {"a": 5, "b": 6}
    with session(inline_gateway, key, tasks=False) as mcp:
        record = f"{settings.GATEWAY_REDIS_PREFIX}mcp-session:{mcp.http.headers['mcp-session-id']}"
        assert redis.Redis.from_url(os.environ["REDIS_URL"]).delete(record) == 1  # as a DELETE through another does
        body = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": "demo__add", "arguments": arguments},
        }
        gone = mcp.http.post(mcp.url, json=body)
    assert (gone.status_code, gone.json()["error"]["message"]) == (404, NOT_FOUND)
    assert not SignOff.objects.filter(agent=carol, arguments_sha256=arguments_digest(arguments)).exists()


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
def test_in_each_era_a_request_expires_and_a_call_changed_after_its_sign_off_is_asked_again(
    gateway, sign_off_rule, era
):
    carol, key, made = sign_off_rule
    made.sign_off_wait = 4
    made.save()
    pending_call(gateway, key, {"a": 0, "b": 1})  # the gateway has seen the rule's new version
    expired = "SIGNOFF_EXPIRED" if era == "legacy" else "SIGNOFF_PENDING"  # held past the wait, or told to come back

    def made_call(arguments: dict[str, Any]) -> Any:
        return run(lambda: call(gateway.url, key, "demo__add", arguments, mode=era))

    first = made_call({"a": 1, "b": 2})
    ident = first.data["signOffId"]
    assert first.data["code"] == expired
    if era != "legacy":  # made again once the wait is over, it is asked anew
        again = eventually(lambda: (answer := made_call({"a": 1, "b": 2})).data["signOffId"] != ident and answer, 15)
        assert again.data["code"] == "SIGNOFF_PENDING"
    assert SignOff.objects.get(pk=ident).state == "expired"
    assert AuditEvent.objects.filter(kind="signoff_expired", detail__sign_off=ident).count() == 1
    granted = pending_call(gateway, key, {"a": 5, "b": 5}).data["signOffId"]
    assert api(gateway, "POST", f"signoffs/{granted}/grant", ann_token(), json={}).status_code == 200
    changed = made_call({"a": 5, "b": 6})
    assert changed.data["code"] == expired and changed.data["signOffId"] != granted
    assert SignOff.objects.get(pk=granted).state == "granted"  # left to the call it covers
    assert made_call({"a": 5, "b": 5}).content[0].text == "10"


@pytest.fixture(scope="module")
def short_hold(server_env, world, logs) -> Iterator[servers.Running]:
    """A gateway that holds a call a second at most, and lets a caller have two requests pending."""
    settings = {
        "GATEWAY_SIGN_OFF_HOLD_SECONDS": str(HOLD_SECONDS),
        "GATEWAY_SIGN_OFF_PENDING_PER_CALLER": str(PER_CALLER),
    }
    with servers.inline_gateway_with(server_env, logs / "gateway-sign-off-held.log", **settings) as running:
        yield running


@pytest.fixture
def rule_of(approver, world) -> Iterator[tuple[object, str]]:
    ann, group = approver
    with agent("signoff-hal") as (hal, key):
        demo = Upstream.objects.get(slug="demo")
        Rule.objects.create(effect="sign_off", agent=hal, upstream=demo, tool_pattern="add", signers=group)
        yield hal, key


def test_a_call_still_undecided_at_the_end_of_the_hold_is_told_to_come_back(short_hold, rule_of):
    hal, key = rule_of
    pending_call(short_hold, key, {"a": 0, "b": 0})  # the gateway has seen the agent and rule
    answer = run(lambda: call(short_hold.url, key, "demo__add", {"a": 1, "b": 1}))  # 2025-11-25: held, then told
    ident = str(asked_for(hal, {"a": 1, "b": 1}).id)
    assert isinstance(answer, MCPError) and (answer.code, answer.data["code"]) == (-32003, "SIGNOFF_PENDING")
    assert answer.data["signOffId"] == ident and 0 < answer.data["retryAfter"] <= 10 and answer.data["requestId"]
    again = run(lambda: call(short_hold.url, key, "demo__add", {"a": 1, "b": 1}))
    assert again.data["signOffId"] == ident  # the same call joins its request


def test_a_flood_of_calls_needing_sign_off_is_told_busy_with_retry_after(short_hold, rule_of):
    hal, key = rule_of
    pending_call(short_hold, key, {"a": 0, "b": 0})  # the first of PER_CALLER requests
    modern = "2026-07-28"
    second = run(lambda: call(short_hold.url, key, "demo__add", {"a": 0, "b": 1}, mode=modern))
    assert second.data["code"] == "SIGNOFF_PENDING"
    busy = run(lambda: call(short_hold.url, key, "demo__add", {"a": 0, "b": 2}, mode=modern))
    assert isinstance(busy, MCPError) and (busy.code, busy.data["code"]) == (-32003, "SIGNOFF_BUSY")
    assert 0 < busy.data["retryAfter"] <= 900 and "signOffId" not in busy.data
    assert str(busy) == (
        f"You have {PER_CALLER} calls waiting for sign-off already: 'demo__add' was not asked for. "
        "Retry once one of them is decided."
    )
    assert SignOff.objects.filter(agent=hal, state="pending").count() == PER_CALLER
    joined = run(lambda: call(short_hold.url, key, "demo__add", {"a": 0, "b": 1}, mode=modern))
    assert joined.data["code"] == "SIGNOFF_PENDING"  # an identical call still joins its own request
