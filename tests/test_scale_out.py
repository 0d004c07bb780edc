"""Two web processes behind HAProxy in round robin, with no affinity: a 2025-11-25 client's whole life works
with its requests spread over both (sessions in Redis: handoff/endpoints/streamable_http/redis_sessions.py)."""

import json
import os
import re
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
import redis
from django.conf import settings
from mcp import types

from handoff.endpoints.streamable_http.sessions import NOT_FOUND
from tests import servers
from tests.clients import raw_session, reply_of, sdk_client, sse_events, tool_names, watched_client
from tests.conftest import needs
from tests.factories import agent, demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run

POST = re.compile(r'"POST /mcp"')
TRIAGE = "switchboard__handoff_to_finance"
RETURN = "switchboard__return_to_triage"
ECHO = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "demo__echo", "arguments": {"text": "x"}}}


@pytest.fixture(scope="module")
def balanced(server_env, world, logs) -> Iterator[tuple[str, list[servers.Running]]]:
    """Two inline gateways on PostgreSQL and Redis, and HAProxy sending each request to the next of them."""
    needs(bool(server_env.get("REDIS_URL")), "REDIS_URL is not set: sessions live in one process without it")
    needs(shutil.which("haproxy") is not None, "haproxy is not installed (apt-get install haproxy)")
    gateways = [
        servers.start_gateway(server_env | {"GATEWAY_EXECUTOR": "inline"}, logs / f"gateway-{n}.log") for n in "ab"
    ]
    try:
        proxy = servers.start_balancer(gateways, server_env, logs)
        try:
            yield proxy.url, gateways
        finally:
            proxy.stop()
    finally:
        for gateway in gateways:
            gateway.stop()


def _posts(log: Path) -> int:
    return len(POST.findall(log.read_text()))


def test_a_sessions_whole_life_works_with_its_requests_spread_over_two_processes(balanced, world, tmp_path):
    url, gateways = balanced
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    slug = f"spread-{uuid.uuid4().hex[:8]}"
    before = [_posts(g.log) for g in gateways]
    progress: list[float] = []
    asked: list[str] = []

    async def elicited(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": "teal"})

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append(done)

    with demo_upstream(slug, env={"DEMO_MANIFEST": str(manifest)}, new_tools="approve"):
        eventually(lambda: f"{slug}__announce" in run(lambda: tool_names(url, world.key)))

        async def life() -> tuple[list[str], str, str, set[str]]:
            async with watched_client(url, world.key, "legacy") as (client, changes):
                echoes = [(await client.call_tool("demo__echo", {"text": f"n{n}"})).content[0].text for n in range(6)]
                done = await client.call_tool("demo__progress", {"seconds": 0.5}, progress_callback=on_progress)
                async with sdk_client(url, world.key, "legacy", elicitation_callback=elicited) as asking:
                    answer = await asking.call_tool(f"{slug}__ask", {"question": "Colour?"})
                fresh = {"name": "fresh", "description": "New.", "inputSchema": {"type": "object"}}
                manifest.write_text(json.dumps({"tools": [fresh]}))
                await client.call_tool(f"{slug}__announce", {})
                await changes.next(timeout=15)  # on the GET stream, held by one process or the other
                # The other process may list before the relay told it to look again (at most a second later).
                listed = set()
                with anyio.fail_after(5):
                    while f"{slug}__fresh" not in listed:
                        listed = {tool.name for tool in (await client.list_tools()).tools}
                return echoes, done.content[0].text, answer.content[0].text, listed

        echoes, done, answer, listed = run(life)
    assert echoes == [f"n{n}" for n in range(6)]
    assert done == "done" and progress
    assert (answer, asked) == ('accept: {"answer": "teal"}', ["Colour?"])
    assert f"{slug}__fresh" in listed
    spread = [_posts(g.log) - b for g, b in zip(gateways, before, strict=True)]
    assert min(spread) >= 5, spread  # round robin: each process served about half


def test_a_session_deleted_through_one_process_is_gone_in_the_other(balanced, world):
    """Both processes served the session before it ended in one of them: the other answers its next requests 404,
    and a call never reaches the upstream (no row)."""
    _, (a, b) = balanced
    session = raw_session(a.url, world.key)
    for gateway in (a, b):
        served = httpx2.post(f"{gateway.url}/mcp", json=ECHO, headers=session, timeout=30)
        assert reply_of(served)["result"]["content"][0]["text"] == "x"
    assert httpx2.delete(f"{b.url}/mcp", headers=session).status_code == 200
    mark = audit_mark()
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    for request in (ping, ECHO):
        gone = httpx2.post(f"{a.url}/mcp", json=request, headers=session, timeout=30)
        assert gone.status_code == 404 and gone.json()["error"] == {"code": -32600, "message": NOT_FOUND}
    assert [r.kind for r in audit_since(mark) if r.session_id == session["mcp-session-id"]] == []


def test_an_unknown_tools_call_in_a_session_ended_in_the_other_process_is_answered_404_not_refused(balanced, world):
    """A call that is refused before admission (here: a tool that does not exist) in a session this process held
    but which ended elsewhere: the session's state is read before anything is refused or written."""
    _, (a, b) = balanced
    session = raw_session(a.url, world.key)
    assert reply_of(httpx2.post(f"{a.url}/mcp", json=ECHO, headers=session, timeout=30))["result"]
    assert httpx2.delete(f"{b.url}/mcp", headers=session).status_code == 200
    mark = audit_mark()
    unknown = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "demo__nothing", "arguments": {}}}
    gone = httpx2.post(f"{a.url}/mcp", json=unknown, headers=session, timeout=30)
    assert gone.status_code == 404 and gone.json()["error"] == {"code": -32600, "message": NOT_FOUND}
    assert [r.kind for r in audit_since(mark) if r.session_id == session["mcp-session-id"]] == []


def _commands_with(key: str, during: Callable[[], object]) -> list[list[str]]:
    """The commands that clients (not scripts) sent to Redis naming `key` while `during` ran."""
    seen: list[list[str]] = []
    marker = f"monitor-done-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    with client.monitor() as monitor:
        watched = threading.Event()

        def watch() -> None:
            for command in monitor.listen():
                watched.set()
                if marker in command["command"]:
                    return
                if command["client_type"] != "lua" and key in command["command"]:
                    seen.append(command["command"].split())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        client.ping()  # the monitor's first line: it is listening from here on
        eventually(watched.is_set)
        during()
        client.echo(marker)
        watcher.join(timeout=10)
    assert not watcher.is_alive()
    return seen


def test_a_call_in_a_session_its_process_holds_reads_the_session_only_in_its_admission(balanced, world):
    """The front door takes a session it holds as last read for a tools/call: the session's record and handoff
    entry are checked (and the record renewed) by the call's admission script, in its one round trip; another
    request (ping) still reads them at the door."""
    _, (a, _) = balanced
    session = raw_session(a.url, world.key)
    record = f"{settings.GATEWAY_REDIS_PREFIX}mcp-session:{session['mcp-session-id']}"
    client = redis.Redis.from_url(os.environ["REDIS_URL"])
    client.expire(record, 5)  # renewed to the idle time by whatever reads it
    called = _commands_with(record, lambda: httpx2.post(f"{a.url}/mcp", json=ECHO, headers=session, timeout=30))
    assert client.ttl(record) > 5
    pinged = _commands_with(
        record, lambda: httpx2.post(f"{a.url}/mcp", json={"jsonrpc": "2.0", "id": 9, "method": "ping"}, headers=session)
    )
    assert len(called) == 1 and f"{settings.GATEWAY_REDIS_PREFIX}calls:" in " ".join(called[0])  # the admission's
    assert len(pinged) == 1 and f"{settings.GATEWAY_REDIS_PREFIX}calls:" not in " ".join(pinged[0])  # the door's


def test_a_call_in_a_session_changed_in_the_other_process_runs_its_stages_again_on_the_change_and_once(balanced, world):
    """The process holding the session took it as last read; the other changed it (its log level): the call's
    admission finds the record changed and takes nothing, the session is read again, and the call goes through,
    admitted and recorded once."""
    _, (a, b) = balanced
    session = raw_session(a.url, world.key)
    record = f"{settings.GATEWAY_REDIS_PREFIX}mcp-session:{session['mcp-session-id']}"
    level = {"jsonrpc": "2.0", "id": 4, "method": "logging/setLevel", "params": {"level": "error"}}
    assert "result" in reply_of(httpx2.post(f"{b.url}/mcp", json=level, headers=session, timeout=30))
    mark = audit_mark()
    answers: list[dict] = []
    called = _commands_with(
        record,
        lambda: answers.append(reply_of(httpx2.post(f"{a.url}/mcp", json=ECHO, headers=session, timeout=30))),
    )
    assert answers[0]["result"]["content"][0]["text"] == "x"
    assert [command[2] for command in called] == ["12", "2"]  # the admission (changed), then the session's read
    rows = [r.kind for r in audit_since(mark) if r.session_id == session["mcp-session-id"]]
    assert rows == ["approved", "completed"]


def test_a_handoff_made_through_one_web_process_routes_the_sessions_calls_through_another(
    celery_gateway, specialists, traced_env, logs
):
    """With the Celery executor (the default with Redis) a tunnel lives in a worker, so any web process serves a
    handed-off session: both served it before, and each call reads the session's handoff entry as it stands, the
    specialist's tools through the other process once handed off, the triage's again once returned."""
    a, b = celery_gateway, servers.start_gateway(servers.web_env(traced_env, "celery"), logs / "gateway-celery-b.log")
    try:
        with agent("scale-out-handoff") as (_, key):
            eventually(lambda: TRIAGE in run(lambda: tool_names(a.url, key)), timeout=10)
            session = raw_session(a.url, key)

            def called(gateway: servers.Running, name: str, arguments: dict) -> dict:
                params = {"name": name, "arguments": arguments}
                body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}
                return reply_of(httpx2.post(f"{gateway.url}/mcp", json=body, headers=session, timeout=30))

            before = called(b, "demo__echo", {"text": "before"})
            handed = called(a, TRIAGE, {"reason": "a budget question", "context": {"account": "A-1"}})
            context = called(b, "finance__handoff_context", {})
            refused = called(b, "demo__echo", {"text": "during"})
            back = called(a, RETURN, {"note": "done"})
            after = called(b, "demo__echo", {"text": "after"})
    finally:
        b.stop()
    assert before["result"]["content"][0]["text"] == "before"
    assert handed["result"]["content"][0]["text"].startswith("Handed off to the finance specialist.")
    assert json.loads(context["result"]["content"][0]["text"])["state"] == {"account": "A-1"}
    assert (refused["error"]["code"], refused["error"]["data"]["code"]) == (-32602, "HANDOFF_NAMESPACE_MISMATCH")
    report = '<upstream_report source="finance" trusted="false">\nfinance specialist summary: done\n'
    assert report in back["result"]["content"][0]["text"]
    assert after["result"]["content"][0]["text"] == "after"


def test_an_answer_that_reaches_the_other_process_gets_to_the_question(balanced, world):
    """The question goes out on one process's stream; the client's answer is posted to the other one."""
    _, (a, b) = balanced
    session = raw_session(a.url, world.key, {"elicitation": {}})
    httpx2.post(f"{b.url}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "demo__ask", "arguments": {}}}
    with httpx2.stream("POST", f"{a.url}/mcp", json=call, headers=session, timeout=30) as stream:
        events = (event["data"] for event in sse_events(stream) if event.get("data"))
        question = next(e for e in events if e.get("method") == "elicitation/create")
        answer = {"jsonrpc": "2.0", "id": question["id"], "result": {"action": "accept", "content": {"answer": "x"}}}
        assert httpx2.post(f"{b.url}/mcp", json=answer, headers=session).status_code == 202
        reply = next(e for e in events if e.get("id") == 2)
    assert reply["result"]["content"][0]["text"] == 'accept: {"answer": "x"}'


def test_a_session_carries_on_through_another_process_when_its_own_stops(server_env, world, logs):
    """SIGTERM drains a process (docs/internals.md); its sessions are in Redis, so their clients go on elsewhere."""
    needs(bool(server_env.get("REDIS_URL")), "REDIS_URL is not set: sessions live in one process without it")
    env = server_env | {"GATEWAY_EXECUTOR": "inline"}
    first = servers.start_gateway(env, logs / "gateway-stopping.log")
    second = servers.start_gateway(env, logs / "gateway-staying.log")
    try:
        session = raw_session(first.url, world.key)
        assert httpx2.post(f"{first.url}/mcp", json=ECHO, headers=session, timeout=30).status_code == 200
        first.stop()
        assert first.process.returncode is not None
        after = httpx2.post(f"{second.url}/mcp", json=ECHO, headers=session, timeout=30)
    finally:
        first.stop()
        second.stop()
    # JSON or a stream: a call that waits (here for the upstream to start in this process) is answered as one.
    assert after.status_code == 200 and reply_of(after)["result"]["content"][0]["text"] == "x"


def test_a_draining_process_ends_its_get_streams_and_the_client_resumes_elsewhere(server_env, world, logs):
    """A call still running holds the drain (up to GATEWAY_DRAIN_SECONDS); a GET stream does not: it ends at
    once, and its client resumes it on another process with its Last-Event-ID."""
    needs(bool(server_env.get("REDIS_URL")), "REDIS_URL is not set: sessions live in one process without it")
    env = server_env | {"GATEWAY_EXECUTOR": "inline"}
    first = servers.start_gateway(env, logs / "gateway-draining.log")
    second = servers.start_gateway(env, logs / "gateway-resuming.log")
    mark = f"drain-{uuid.uuid4().hex[:12]}"
    slow = {"name": "demo__sleep", "arguments": {"seconds": 5, "mark": mark}}
    call_done = threading.Event()
    caller = threading.Thread(target=lambda: None)
    try:
        session = raw_session(first.url, world.key)
        listen = session | {"accept": "text/event-stream"}

        def slow_call() -> None:
            body = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": slow}
            httpx2.post(f"{first.url}/mcp", json=body, headers=session, timeout=30)
            call_done.set()

        with httpx2.stream("GET", f"{first.url}/mcp", headers=listen, timeout=30) as stream:
            events = sse_events(stream)
            priming = next(events)
            caller = threading.Thread(target=slow_call)
            caller.start()
            eventually(lambda: servers.demo_started(mark))  # the drain has a call to wait for
            os.killpg(first.process.pid, signal.SIGTERM)
            rest = list(events)  # the stream ends at once: the drain does not wait for it
        ended_first = not call_done.is_set()
        with httpx2.stream("GET", f"{second.url}/mcp", headers=listen | {"last-event-id": priming["id"]}) as resumed:
            resumed_as = (resumed.status_code, resumed.headers["content-type"])
    finally:
        first.stop()
        second.stop()
        caller.join(timeout=30)
    assert (priming["data"], rest, ended_first) == ("", [], True)
    assert resumed_as == (200, "text/event-stream")
    assert call_done.is_set(), "the call in flight was finished by the draining process"


def test_a_draining_process_serves_on_through_its_notice_while_its_readiness_says_503(server_env, world, logs):
    """GATEWAY_DRAIN_NOTICE_SECONDS: a balancer that sends a request before its next /readyz probe is answered,
    not refused by a process already closed; then the process ends on its own."""
    env = server_env | {"GATEWAY_EXECUTOR": "inline", "GATEWAY_DRAIN_NOTICE_SECONDS": "5"}
    gateway = servers.start_gateway(env, logs / "gateway-notice.log")
    try:
        session = raw_session(gateway.url, world.key)  # a request: from now on the drain handles SIGTERM
        os.killpg(gateway.process.pid, signal.SIGTERM)
        eventually(lambda: httpx2.get(f"{gateway.url}/readyz", timeout=5).status_code == 503)
        during = httpx2.post(f"{gateway.url}/mcp", json=ECHO, headers=session, timeout=30)
        eventually(lambda: gateway.process.poll() is not None, timeout=30)
    finally:
        gateway.stop()
    assert during.status_code == 200 and reply_of(during)["result"]["content"][0]["text"] == "x"
    assert gateway.process.returncode is not None
