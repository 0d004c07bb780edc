"""Sign-off as a task (2025-11-25's experimental tasks): a client that declared `tasks` and makes a call needing
sign-off as a task gets the task at once, `working` while a person decides, then the result through tasks/result;
refused, it fails with the refusal; cancelled, its wait ends and the request stays pending; a task is its caller's
only. Raw JSON-RPC over HTTP: the SDK client has no tasks."""

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx2
import pytest

from audit.models import AuditEvent
from policy.models import SignOff
from tests.clients import ACCEPT, STATELESS_META, api, reply_of, stateless_headers
from tests.helpers import audit_mark, audit_since, eventually
from tests.test_sign_off import ann_token, approver, asked_for, pending_call, sign_off_rule  # noqa: F401 (fixtures)

VERSION = "2025-11-25"
ADD = {"a": 4, "b": 5}


class Session:
    """One 2025-11-25 session, request by request."""

    def __init__(self, http: httpx2.Client, url: str) -> None:
        self.http, self.url, self.ids = http, url, iter(range(2, 10_000))

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"jsonrpc": "2.0", "id": next(self.ids), "method": method} | ({"params": params} if params else {})
        return reply_of(self.http.post(self.url, json=body))

    def result(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = self.request(method, params)
        assert "result" in reply, reply
        return reply["result"]

    def call(self, arguments: dict[str, Any], **task: int) -> dict[str, Any]:
        return self.request(
            "tools/call", {"name": "demo__add", "arguments": arguments} | ({"task": task} if task else {})
        )


@contextmanager
def session(gateway, key: str, *, tasks: bool = True, timeout: float = 30.0) -> Iterator[Session]:
    """A session opened by initialize, declaring the `tasks` capability or not."""
    capabilities = {"tasks": {"cancel": {}}} if tasks else {}
    headers = {"authorization": f"Bearer {key}", "accept": ACCEPT}
    with httpx2.Client(headers=headers, timeout=timeout) as http:
        url = f"{gateway.url}/mcp"
        client = {"name": "tasks-test", "version": "1"}
        params = {"protocolVersion": VERSION, "capabilities": capabilities, "clientInfo": client}
        opened = http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
        assert opened.status_code == 200, opened.text
        assert reply_of(opened)["result"]["capabilities"]["tasks"] == {
            "cancel": {},
            "requests": {"tools": {"call": {}}},
        }
        http.headers.update({"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": VERSION})
        assert http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}).status_code == 202
        yield Session(http, url)


@pytest.fixture
def rule_seen(inline_gateway, sign_off_rule) -> tuple[object, str]:  # noqa: F811
    """carol and her key, once the gateway has seen her sign-off rule."""
    carol, key, made = sign_off_rule
    pending_call(inline_gateway, key, {"a": 0, "b": 0})
    return carol, key


def made_as_task(agent, mcp: Session, arguments: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The call made as a task: answered at once, `working`, naming its sign-off request."""
    task = mcp.call(arguments, ttl=60_000)["result"]["task"]
    ident = str(asked_for(agent, arguments).id)
    assert task["status"] == "working" and task["ttl"] == 60_000 and task["pollInterval"] == 10_000
    assert task["statusMessage"] == f"Waiting for a person to sign off this call (sign-off request {ident})."
    return task, ident


def ended(mcp: Session, task_id: str) -> dict[str, Any]:
    """The task once it is no longer working: a bound for a loaded machine (a CI run's neighbours), not a speed."""
    return eventually(lambda: (got := mcp.result("tasks/get", {"taskId": task_id}))["status"] != "working" and got, 20)


def test_a_task_is_working_while_it_waits_then_completed_with_the_result(gateway, sign_off_rule):  # noqa: F811
    carol, key, made = sign_off_rule
    pending_call(gateway, key, {"a": 0, "b": 0})  # the gateway has seen the rule
    mark = audit_mark()
    with session(gateway, key) as mcp:
        listed = {tool["name"]: tool for tool in mcp.result("tools/list")["tools"]}
        assert listed["demo__add"]["execution"] == {"taskSupport": "optional"}
        assert [name for name, tool in listed.items() if "execution" in tool] == ["demo__add"], listed
        task, ident = made_as_task(carol, mcp, ADD)
        assert mcp.result("tasks/get", {"taskId": task["taskId"]})["status"] == "working"
        assert not AuditEvent.objects.filter(id__gt=mark, kind__in=("denied", "approved")).exists()
        assert api(gateway, "POST", f"signoffs/{ident}/grant", ann_token(), json={}).status_code == 200
        assert ended(mcp, task["taskId"])["status"] == "completed"
        result = mcp.result("tasks/result", {"taskId": task["taskId"]})
    assert result["content"] == [{"type": "text", "text": "9"}]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    rows = [(r.kind, r.detail.get("sign_off")) for r in audit_since(mark) if r.kind in ("approved", "completed")]
    assert rows == [("approved", ident), ("completed", ident)]  # exactly one completion row
    assert not AuditEvent.objects.filter(id__gt=mark, kind="denied").exists()


def test_a_refused_task_fails_with_the_refusal_and_its_denied_row(inline_gateway, rule_seen):
    carol, key = rule_seen
    mark = audit_mark()
    arguments = {"a": 40, "b": 2}
    with session(inline_gateway, key) as mcp:
        task, ident = made_as_task(carol, mcp, arguments)
        refusal = {"reason": "Not on a Sunday."}
        assert api(inline_gateway, "POST", f"signoffs/{ident}/refuse", ann_token(), json=refusal).status_code == 200
        failed = ended(mcp, task["taskId"])
        result = mcp.request("tasks/result", {"taskId": task["taskId"]})
    message = "ann refused to sign off this call of 'demo__add': Not on a Sunday. Do not retry it unchanged."
    assert (failed["status"], failed["statusMessage"]) == ("failed", message)
    assert result["error"]["message"] == message and result["error"]["data"]["code"] == "SIGNOFF_REFUSED"
    [denied] = [r for r in audit_since(mark) if r.kind == "denied"]
    assert (denied.error_code, denied.detail["sign_off"]) == ("SIGNOFF_REFUSED", ident)
    assert not AuditEvent.objects.filter(id__gt=mark, kind="approved").exists()


def test_a_task_no_one_decides_fails_once_its_request_expires(inline_gateway, sign_off_rule):  # noqa: F811
    carol, key, made = sign_off_rule
    made.sign_off_wait = 2
    made.save()
    pending_call(inline_gateway, key, {"a": 0, "b": 1})  # the gateway has seen the rule's new version
    mark = audit_mark()
    with session(inline_gateway, key) as mcp:
        task, ident = made_as_task(carol, mcp, {"a": 1, "b": 3})
        failed = ended(mcp, task["taskId"])
    assert (failed["status"], failed["statusMessage"]) == (
        "failed",
        f"No one signed off this call of 'demo__add' in time: its request ({ident}) expired. Make the call again "
        "to ask anew, or tell the user someone must sign it off.",
    )
    kinds = [(r.kind, r.error_code) for r in audit_since(mark)]
    assert kinds == [("signoff_asked", ""), ("signoff_expired", ""), ("denied", "SIGNOFF_EXPIRED")]


def test_a_cancelled_task_ends_its_wait_and_the_request_stays_pending(inline_gateway, rule_seen):
    carol, key = rule_seen
    arguments = {"a": 7, "b": 1}
    with session(inline_gateway, key) as mcp:
        task, ident = made_as_task(carol, mcp, arguments)
        cancelled = mcp.result("tasks/cancel", {"taskId": task["taskId"]})
        assert (cancelled["status"], cancelled["statusMessage"]) == ("cancelled", "Cancelled by its client.")
        assert mcp.result("tasks/get", {"taskId": task["taskId"]})["status"] == "cancelled"
        again = mcp.request("tasks/cancel", {"taskId": task["taskId"]})["error"]
        no_result = mcp.request("tasks/result", {"taskId": task["taskId"]})["error"]
    assert again == {
        "code": -32602,
        "message": f"Task {task['taskId']!r} has ended already (cancelled): it cannot be cancelled.",
    }
    assert (no_result["code"], no_result["message"]) == (
        -32602,
        f"Task {task['taskId']!r} was cancelled: it has no result.",
    )
    assert SignOff.objects.get(pk=ident).state == "pending"


def test_another_session_knows_nothing_of_the_task(inline_gateway, rule_seen):
    carol, key = rule_seen
    with session(inline_gateway, key) as mcp, session(inline_gateway, key) as other:
        task, ident = made_as_task(carol, mcp, {"a": 2, "b": 2})
        unknown = other.request("tasks/get", {"taskId": task["taskId"]})["error"]
        assert unknown == {"code": -32602, "message": f"Unknown task {task['taskId']!r}: none of yours has this id."}
        assert mcp.result("tasks/get", {"taskId": task["taskId"]})["status"] == "working"
        mcp.result("tasks/cancel", {"taskId": task["taskId"]})


def test_a_task_ends_with_its_session_and_leaves_the_grant_to_the_next_call(inline_gateway, rule_seen):
    carol, key = rule_seen
    arguments = {"a": 5, "b": 5}
    with session(inline_gateway, key) as mcp:
        task, ident = made_as_task(carol, mcp, arguments)
        assert mcp.http.delete(mcp.url).status_code in (200, 204)
    assert api(inline_gateway, "POST", f"signoffs/{ident}/grant", ann_token(), json={}).status_code == 200
    with session(inline_gateway, key, tasks=False) as mcp:  # had the task still waited, it would have taken it
        result = mcp.call(arguments)["result"]
    assert result["content"] == [{"type": "text", "text": "10"}]
    assert AuditEvent.objects.filter(kind="completed", detail__sign_off=ident).count() == 1


def test_a_client_without_tasks_waits_within_its_request_as_before(inline_gateway, rule_seen):
    carol, key = rule_seen
    arguments = {"a": 3, "b": 6}
    with session(inline_gateway, key, tasks=False) as mcp:
        assert {tool["name"]: tool.get("execution") for tool in mcp.result("tools/list")["tools"]}["demo__add"] is None
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(mcp.call, arguments, ttl=60_000)  # a task it may not ask for is not made
            ident = str(asked_for(carol, arguments).id)
            assert api(inline_gateway, "POST", f"signoffs/{ident}/grant", ann_token(), json={}).status_code == 200
            result = answer.result(timeout=30)["result"]
    assert result["content"] == [{"type": "text", "text": "9"}] and "task" not in result


def test_each_era_has_only_its_own_tasks_methods(inline_gateway, rule_seen):
    """2025-11-25's tasks/result is not 2026-07-28's (whose Tasks extension polls tasks/get), and the extension's
    tasks/update is not 2025-11-25's; a method both have answers for an unknown task as such."""
    carol, key = rule_seen
    params = {"taskId": "any", "_meta": STATELESS_META}
    for method in ("tasks/result", "tasks/get"):
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        headers = stateless_headers(key, "any") | {"mcp-method": method}
        answer = httpx2.post(f"{inline_gateway.url}/mcp", json=body, headers=headers, timeout=5)
        if method == "tasks/result":
            assert (answer.status_code, reply_of(answer)["error"]) == (
                404,
                {"code": -32601, "message": "Method not found", "data": method},
            )
        else:
            unknown = "Unknown task 'any': none of yours has this id, or it expired."
            assert reply_of(answer)["error"] == {"code": -32602, "message": unknown}
    with session(inline_gateway, key) as mcp:
        refused = mcp.request("tasks/update", {"taskId": "any", "inputResponses": {}})["error"]
    assert (refused["code"], refused["message"]) == (-32601, "Method not found")


def test_another_process_of_the_session_answers_for_a_task_and_cancels_it(inline_gateway, celery_gateway, rule_seen):
    """Sessions are in Redis: any web process serves a session's requests. The one that took the call runs it; the
    other answers from its row, waits on it for tasks/result, and has the runner stop on tasks/cancel."""
    carol, key = rule_seen
    pending_call(celery_gateway, key, {"a": 0, "b": 0})
    with session(inline_gateway, key) as mcp:
        task, ident = made_as_task(carol, mcp, {"a": 30, "b": 3})
        stopped, _ = made_as_task(carol, mcp, {"a": 1, "b": 30})
        other = Session(mcp.http, f"{celery_gateway.url}/mcp")
        assert other.result("tasks/get", {"taskId": task["taskId"]})["status"] == "working"
        assert other.result("tasks/cancel", {"taskId": stopped["taskId"]})["status"] == "cancelled"
        assert ended(mcp, stopped["taskId"])["status"] == "cancelled"  # the process running it stopped its wait
        assert api(inline_gateway, "POST", f"signoffs/{ident}/grant", ann_token(), json={}).status_code == 200
        result = other.result("tasks/result", {"taskId": task["taskId"]})
        assert ended(other, task["taskId"])["status"] == "completed"
    assert result["content"] == [{"type": "text", "text": "33"}]
    assert asked_for(carol, {"a": 1, "b": 30}).state == "pending"  # a cancelled task leaves its request
