# ruff: noqa: F811 (the fixtures imported from test_sign_off are arguments here)
"""Sign-off as a task of 2026-07-28's Tasks extension (`io.modelcontextprotocol/tasks`): a request declaring it gets a
task, `working` while a person decides; the poll that finds the request decided runs the call (granted) or refuses
it (refused), in whichever web process serves the poll; an expired request, a cancelled task, another caller's task
and the methods of the other era each get their own answer. Raw JSON-RPC over HTTP: the SDK client has no tasks."""

from datetime import timedelta
from typing import Any

import httpx2
from django.utils import timezone

from handoff.models import ToolTask
from policy.models import SignOff
from tests.clients import STATELESS_META, api, reply_of, stateless_headers
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually
from tests.test_sign_off import ann_token, approver, asked_for, pending_call, sign_off_rule  # noqa: F401, F811 (fixtures)

EXTENSION = "io.modelcontextprotocol/tasks"
META = STATELESS_META | {"io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}}


def request(gateway, key: str, method: str, params: dict[str, Any], meta: dict = META) -> dict[str, Any]:
    """One 2026-07-28 request declaring the extension (or not, with another `meta`); its JSON-RPC reply."""
    headers = stateless_headers(key, params.get("name") or params.get("taskId") or "") | {"mcp-method": method}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params | {"_meta": meta}}
    return reply_of(httpx2.post(f"{gateway.url}/mcp", json=body, headers=headers, timeout=30))


def made(gateway, key: str, arguments: dict[str, Any]) -> dict[str, Any]:
    reply = request(gateway, key, "tools/call", {"name": "demo__add", "arguments": arguments})
    assert reply["result"]["resultType"] == "task", reply
    return reply["result"]


def polled(gateway, key: str, task_id: str) -> dict[str, Any]:
    return request(gateway, key, "tasks/get", {"taskId": task_id})["result"]


def test_the_task_works_while_the_request_waits_and_the_poll_after_the_grant_runs_the_call(gateway, sign_off_rule):
    carol, key, rule = sign_off_rule
    pending_call(gateway, key, {"a": 0, "b": 0})  # the gateway has seen the rule
    discovered = request(gateway, key, "server/discover", {})["result"]
    assert discovered["capabilities"]["extensions"][EXTENSION] == {}
    mark = audit_mark()
    task = made(gateway, key, {"a": 4, "b": 5})
    ident = str(asked_for(carol, {"a": 4, "b": 5}).id)
    assert (task["status"], task["ttlMs"], task["pollIntervalMs"]) == ("working", 3_600_000, 10_000)
    assert f"sign-off request {ident}" in task["statusMessage"]
    assert polled(gateway, key, task["taskId"])["status"] == "working"
    assert api(gateway, "POST", f"signoffs/{ident}/grant", ann_token(), json={}).status_code == 200
    done = polled(gateway, key, task["taskId"])
    assert (done["status"], done["result"]["content"]) == ("completed", [{"type": "text", "text": "9"}])
    assert done["resultType"] == "complete" and polled(gateway, key, task["taskId"]) == done  # ran once
    calls = ("denied", "approved", "completed")
    rows = [(r.kind, r.error_code, r.detail.get("sign_off")) for r in audit_since(mark) if r.kind in calls]
    assert rows == [("denied", "SIGNOFF_PENDING", ident), ("approved", "", ident), ("completed", "", ident)]
    assert ToolTask.objects.get(id=task["taskId"]).arguments is None  # kept only until the call ran


def test_a_task_made_in_one_web_process_is_polled_and_run_in_another(inline_gateway, celery_gateway, sign_off_rule):
    carol, key, rule = sign_off_rule
    pending_call(inline_gateway, key, {"a": 0, "b": 0})
    pending_call(celery_gateway, key, {"a": 0, "b": 0})
    task = made(inline_gateway, key, {"a": 20, "b": 1})
    ident = str(asked_for(carol, {"a": 20, "b": 1}).id)
    assert polled(celery_gateway, key, task["taskId"])["status"] == "working"
    assert api(inline_gateway, "POST", f"signoffs/{ident}/grant", ann_token(), json={}).status_code == 200
    assert polled(celery_gateway, key, task["taskId"])["result"]["content"] == [{"type": "text", "text": "21"}]


def test_a_refused_request_fails_the_task_with_the_approvers_reason(inline_gateway, sign_off_rule):
    carol, key, rule = sign_off_rule
    pending_call(inline_gateway, key, {"a": 0, "b": 0})
    task = made(inline_gateway, key, {"a": 6, "b": 6})
    ident = str(asked_for(carol, {"a": 6, "b": 6}).id)
    refusal = {"reason": "Not on a Sunday."}
    assert api(inline_gateway, "POST", f"signoffs/{ident}/refuse", ann_token(), json=refusal).status_code == 200
    failed = polled(inline_gateway, key, task["taskId"])
    message = "ann refused to sign off this call of 'demo__add': Not on a Sunday. Do not retry it unchanged."
    assert (failed["status"], failed["statusMessage"]) == ("failed", message)
    assert (failed["error"]["code"], failed["error"]["data"]["code"]) == (-32001, "SIGNOFF_REFUSED")


def test_an_expired_request_fails_the_task_and_a_cancelled_task_leaves_its_request_pending(
    inline_gateway, sign_off_rule
):
    carol, key, rule = sign_off_rule
    pending_call(inline_gateway, key, {"a": 0, "b": 0})
    expiring, cancelled = made(inline_gateway, key, {"a": 1, "b": 2}), made(inline_gateway, key, {"a": 2, "b": 3})
    SignOff.objects.filter(pk=asked_for(carol, {"a": 1, "b": 2}).pk).update(wait_until=timezone.now() - timedelta(1))
    failed = polled(inline_gateway, key, expiring["taskId"])
    assert (failed["status"], failed["error"]["data"]) == ("failed", {"code": "SIGNOFF_EXPIRED"})
    assert failed["statusMessage"].startswith("No one signed off this call of 'demo__add' in time")
    acknowledged = request(inline_gateway, key, "tasks/cancel", {"taskId": cancelled["taskId"]})["result"]
    assert acknowledged["resultType"] == "complete" and "status" not in acknowledged
    assert polled(inline_gateway, key, cancelled["taskId"])["status"] == "cancelled"
    assert asked_for(carol, {"a": 2, "b": 3}).state == "pending"


def test_tasks_are_their_callers_and_each_era_keeps_its_own_methods(inline_gateway, sign_off_rule):
    carol, key, rule = sign_off_rule
    pending_call(inline_gateway, key, {"a": 0, "b": 0})
    mark = audit_mark()
    task = made(inline_gateway, key, {"a": 7, "b": 7})
    unknown = f"Unknown task {task['taskId']!r}: none of yours has this id, or it expired."
    with agent("signoff-mallory") as (_, other):
        eventually(lambda: "error" not in request(inline_gateway, other, "tools/list", {}))
        for method in ("tasks/get", "tasks/update", "tasks/cancel"):
            refused = request(inline_gateway, other, method, {"taskId": task["taskId"]})["error"]
            assert (refused["code"], refused["message"]) == (-32602, unknown), method
    assert request(inline_gateway, key, "tasks/update", {"taskId": task["taskId"], "inputResponses": {}})["result"]
    assert request(inline_gateway, key, "tasks/result", {"taskId": task["taskId"]})["error"]["code"] == -32601
    bare = request(inline_gateway, key, "tools/call", {"name": "demo__add", "arguments": {"a": 8}}, STATELESS_META)
    assert bare["error"]["data"]["code"] == "SIGNOFF_PENDING"  # undeclared: no task
    assert [r.error_code for r in audit_since(mark) if r.kind in ("denied", "approved")] == ["SIGNOFF_PENDING"] * 2
