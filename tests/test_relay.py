"""What travels back from an upstream during a call, through both executors and in both eras: progress
reaches the agent, cancelling a call cancels it at the upstream (the demo server marks it)."""

import json
import os
import uuid

import anyio
import pytest
from django.core import signing
from mcp import types
from mcp.shared.exceptions import MCPError

from audit.models import AuditEvent
from handoff.mcp.input_required import SALT
from tests.clients import sdk_client, tool_names, watched_client, ws_session
from tests.factories import demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, run, until
from tests.otlp import CALLED, stages_of
from tests.servers import CANCELLED_DIR, demo_started, inline_gateway_with

MODES = ["legacy", "2026-07-28"]


@pytest.mark.parametrize("mode", MODES)
def test_upstream_progress_reaches_the_agent(gateway, world, mode):
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async def scenario():
        async with sdk_client(gateway.url, world.key, mode) as client:
            return await client.call_tool("demo__progress", {"seconds": 0.5}, progress_callback=on_progress)

    assert run(scenario).content[0].text == "done"
    assert seen == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("mode", MODES)
def test_cancelling_a_call_cancels_it_at_the_upstream(gateway, world, mode):
    mark, started = f"cancel-{uuid.uuid4().hex[:12]}", audit_mark()

    async def scenario():
        async with sdk_client(gateway.url, world.key, mode, timeout=30) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "demo__sleep", {"seconds": 20, "mark": mark})
                await until(lambda: demo_started(mark), timeout=10)  # cancel once the upstream runs the call
                tg.cancel_scope.cancel()  # the SDK client sends notifications/cancelled for the abandoned call

    run(scenario)
    assert eventually(lambda: os.path.exists(os.path.join(CANCELLED_DIR, mark)), timeout=10)
    rows = eventually(  # the completion row, not merely the approval before it
        lambda: [(r.kind, r.error_code) for r in audit_since(started) if r.exposed_name == "demo__sleep"][1:]
    )
    assert rows == [(AuditEvent.Kind.COMPLETED, "CANCELLED")]


def _answering(answer: str, asked: list[str]):
    async def on_elicitation(context, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": answer})

    return on_elicitation


@pytest.fixture(scope="module")
def legacy_demo(world, inline_gateway):
    """The demo server playing one from before 2026-07-28: it asks on the call's stream, never with an
    input-required result (the gateway finds its era by trying server/discover first)."""
    slug = f"legacy-{uuid.uuid4().hex[:8]}"
    with demo_upstream(slug, env={"DEMO_LEGACY_ONLY": "1"}) as upstream:
        eventually(lambda: f"{slug}__ask" in run(lambda: tool_names(inline_gateway.url, world.key)))
        yield upstream


@pytest.fixture(params=["2026-07-28 upstream", "2025-11-25 upstream"])
def asking(request, legacy_demo) -> str:
    """The namespace of an upstream whose `ask` tool elicits, in the era the parameter names."""
    return "demo" if request.param.startswith("2026") else legacy_demo.slug


def test_an_upstreams_elicitation_is_pushed_to_a_legacy_agent_and_its_answer_returned(gateway, world, asking):
    asked: list[str] = []

    async def scenario():
        async with sdk_client(
            gateway.url, world.key, "legacy", elicitation_callback=_answering("blue", asked)
        ) as client:
            return await client.call_tool(f"{asking}__ask", {"question": "Favourite colour?"})

    result = run(scenario)
    assert (result.is_error, result.content[0].text) == (False, 'accept: {"answer": "blue"}')
    assert asked == ["Favourite colour?"]


def test_an_agent_that_declared_no_elicitation_is_never_asked(gateway, world, asking):
    async def scenario():
        async with sdk_client(gateway.url, world.key, "legacy") as client:
            return await client.call_tool(f"{asking}__ask", {"question": "Favourite colour?"})

    result = run(scenario)
    # Its call goes on a 2025-11-25 connection (the upstream's only era, or the agent's where it speaks both),
    # which carries nothing back: the gateway refuses the ask for the agent, whatever the upstream's era.
    assert result.is_error
    refused = "The service refused the request: The client did not declare the capability for elicitation/create."
    assert result.content[0].text == f"{asking}__ask: {refused}"


def test_a_2026_agent_gets_an_input_required_result_and_its_retry_completes_the_call(gateway, world, asking, traces):
    asked: list[str] = []
    mark = audit_mark()

    async def scenario():
        async with sdk_client(
            gateway.url, world.key, "2026-07-28", elicitation_callback=_answering("green", asked)
        ) as client:
            return await client.call_tool(f"{asking}__ask", {"question": "Favourite colour?"})

    result = run(scenario)
    assert (result.is_error, result.content[0].text) == (False, 'accept: {"answer": "green"}')
    assert asked == ["Favourite colour?"]
    rows = [(r.kind, r.outcome) for r in audit_since(mark) if r.exposed_name == f"{asking}__ask"]
    if asking == "demo":  # passed through: each round is a call of the upstream's own
        assert rows == [("approved", ""), ("completed", "ok")] * 2
    else:  # parked: one call of the upstream's, however many rounds the agent needs
        assert rows == [("approved", ""), ("completed", "ok")]
    # Either way each call passes each stage once: a retry answering a parked call resumes it, not a new pass.
    traced = {r.trace_id for r in audit_since(mark) if r.exposed_name == f"{asking}__ask"}
    assert len(traced) == len(rows) // 2
    assert [stages_of(traces, trace_id) for trace_id in traced] == [{f"tools/call {asking}__ask": CALLED}] * len(traced)


def test_a_tampered_or_foreign_request_state_is_refused(inline_gateway, world, asking):
    from tests.factories import agent

    name = f"{asking}__ask"

    async def first_round(key: str):
        async with sdk_client(inline_gateway.url, key, "2026-07-28", elicitation_callback=_answering("x", [])) as c:
            return await c.session.call_tool(name, {"question": "Q?"}, allow_input_required=True)

    pending = run(lambda: first_round(world.key))
    assert isinstance(pending, types.InputRequiredResult) and len(pending.input_requests) == 1
    [key] = pending.input_requests

    async def retry(key_: str, tool: str, state: str):
        answers = {key: types.ElicitResult(action="accept", content={"answer": "x"})}
        async with sdk_client(inline_gateway.url, key_, "2026-07-28", elicitation_callback=_answering("x", [])) as c:
            with pytest.raises(MCPError) as refused:
                await c.session.call_tool(
                    tool, {"question": "Q?"}, input_responses=answers, request_state=state, allow_input_required=True
                )
            return refused.value.error

    state = pending.request_state
    tampered = state[:-2] + ("AA" if not state.endswith("AA") else "BB")
    mark = audit_mark()
    assert run(lambda: retry(world.key, name, tampered)).message == (
        "Invalid requestState: send back the one the gateway gave, unchanged."
    )
    assert run(lambda: retry(world.key, "demo__echo", state)).message == (
        "Invalid requestState: it was issued for another agent or tool."
    )
    with agent("eve") as (_, eve_key):
        error = eventually(lambda: _refusal_once(lambda: retry(eve_key, name, state)))
    assert (error.code, error.message) == (
        types.INVALID_PARAMS,
        "Invalid requestState: it was issued for another agent or tool.",
    )
    assert [r.error_code for r in audit_since(mark) if r.kind == "denied"][:3] == ["INVALID_REQUEST_STATE"] * 3


def _refusal_once(attempt):
    """The refusal, once the gateway knows the new agent's key (a 401 before: its snapshot lags)."""
    error = run(attempt)
    return error if error.code != types.INVALID_REQUEST else None


@pytest.mark.parametrize("mode", MODES)
def test_an_upstream_announcing_new_tools_is_synced_again_and_agents_are_told(gateway, world, tmp_path, mode):
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    slug = f"changing-{uuid.uuid4().hex[:8]}"  # a slug of its own: a gateway may still route an earlier one's
    with demo_upstream(slug, env={"DEMO_MANIFEST": str(manifest)}, new_tools="approve"):
        eventually(lambda: f"{slug}__announce" in run(lambda: tool_names(gateway.url, world.key, mode)))
        fresh = {"name": "fresh", "description": "A tool that was not there before.", "inputSchema": {"type": "object"}}
        manifest.write_text(json.dumps({"tools": [fresh]}))

        async def scenario():
            async with watched_client(gateway.url, world.key, mode) as (client, changes):
                await client.call_tool(f"{slug}__announce", {})
                await changes.next(timeout=15)
                return {tool.name for tool in (await client.list_tools()).tools}

        assert f"{slug}__fresh" in run(scenario)
        synced = AuditEvent.objects.get(upstream=slug, tool="fresh", kind="admin_change")
        assert (synced.actor, synced.detail["action"]) == (
            "catalog sync (the upstream announced a change)",
            "tool_added",
        )


@pytest.mark.parametrize("mode", MODES)
def test_upstream_log_messages_reach_an_agent_that_asked_for_them_at_its_level(gateway, world, mode):
    async def messages(level: str | None) -> list[tuple[str, str]]:
        received: list[tuple[str, str]] = []

        async def on_log(params: types.LoggingMessageNotificationParams) -> None:
            received.append((params.level, params.data))

        options = {"log_level": level} if mode != "legacy" and level else {}
        async with sdk_client(gateway.url, world.key, mode, logging_callback=on_log, **options) as client:
            if mode == "legacy" and level:
                await client.set_logging_level(level)
            assert (await client.call_tool("demo__log", {})).content[0].text == "logged"
            # Messages travel on the call's own stream, ahead of its result, but their callbacks may trail it:
            # wait for the two asked for, or listen half a second for any message never asked for.
            with anyio.move_on_after(5 if level else 0.5):
                while len(received) < (2 if level else 1):
                    await anyio.sleep(0.02)
        return received

    assert run(lambda: messages("info")) == [("info", "a info message"), ("warning", "a warning message")]
    assert run(lambda: messages(None)) == []  # never asked: never told


async def _sampled(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    prompt = params.messages[0].content.text
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"echo of {prompt}"), model="test-model"
    )


async def _roots(context) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri="file:///work/project", name="project")])


@pytest.mark.parametrize("mode", MODES)
def test_sampling_and_roots_requests_reach_an_agent_that_declared_them(gateway, world, asking, mode):
    async def scenario():
        async with sdk_client(
            gateway.url, world.key, mode, sampling_callback=_sampled, list_roots_callback=_roots
        ) as client:
            sampled = await client.call_tool(f"{asking}__ask", {"question": "Say hi", "of": "sampling"})
            rooted = await client.call_tool(f"{asking}__ask", {"question": "", "of": "roots"})
            return sampled.content[0].text, rooted.content[0].text

    assert run(scenario) == ("the model said: echo of Say hi", "roots: file:///work/project")


def test_a_2026_agent_is_never_asked_what_it_did_not_declare(gateway, world):
    async def scenario():
        async with sdk_client(gateway.url, world.key, "2026-07-28", sampling_callback=_sampled) as client:
            return await client.call_tool("demo__ask", {"question": "Favourite colour?"})

    result = run(scenario)
    # The upstream asked for elicitation all the same (the demo server does not check): the gateway refuses.
    assert result.is_error
    assert result.content[0].text == (
        "demo__ask: the service asked for elicitation/create, which this client did not declare."
    )


def test_an_upstreams_elicitation_reaches_a_websocket_agent_and_its_answer_returns(gateway, world):
    async def scenario():
        async with ws_session(gateway.url, world.key, capabilities={"elicitation": {}}) as ws:
            asked = await ws.request("tools/call", {"name": "demo__ask", "arguments": {"question": "Colour?"}})
            assert (asked["method"], asked["params"]["message"]) == ("elicitation/create", "Colour?")
            answer = {"action": "accept", "content": {"answer": "red"}}
            return await ws.send_raw(json.dumps({"jsonrpc": "2.0", "id": asked["id"], "result": answer}))

    reply = run(scenario)
    assert reply["result"]["content"][0]["text"] == 'accept: {"answer": "red"}'


def test_an_upstreams_missing_capability_error_reaches_a_2026_agent_as_it_is(gateway, world):
    async def scenario(**callbacks):
        async with sdk_client(gateway.url, world.key, "2026-07-28", **callbacks) as client:
            try:
                return await client.call_tool("demo__needs_sampling", {})
            except MCPError as refused:
                return refused.error

    refused = run(scenario)
    assert (refused.code, refused.message, refused.data) == (
        -32021,
        "The service refused the request: This tool needs the sampling capability.",
        {"requiredCapabilities": {"sampling": {}}},
    )
    # The agent's client declares it: the gateway's upstream session declares it too, and the tool runs.
    assert run(lambda: scenario(sampling_callback=_sampled)).content[0].text == "sampling declared"


def _expired(request_state: str, seconds: float) -> bool:
    """Whether a gateway with GATEWAY_INPUT_WAIT_SECONDS=`seconds` now finds the state expired: it is signed
    with the SECRET_KEY this process shares (server_env), and read against the same clock."""
    try:
        signing.loads(request_state, salt=SALT, max_age=seconds)
    except signing.SignatureExpired:
        return True
    return False


def test_a_request_state_is_refused_once_its_parked_call_is_over_or_it_expired(server_env, world, legacy_demo, logs):
    name, wait = f"{legacy_demo.slug}__ask", 2
    answers = {"elicitation-1": types.ElicitResult(action="accept", content={"answer": "x"})}

    async def answered(gateway, times: int, once_expired: bool = False) -> list:
        """The first round, then `times` answers with its state (once that has expired, if asked): results or
        errors."""
        async with sdk_client(gateway.url, world.key, "2026-07-28", elicitation_callback=_answering("x", [])) as c:
            pending = await c.session.call_tool(name, {"question": "Q?"}, allow_input_required=True)
            await until(lambda: not once_expired or _expired(pending.request_state, seconds=wait), timeout=10)
            replies = []
            for _ in range(times):
                try:
                    replies.append(
                        await c.session.call_tool(
                            name,
                            {"question": "Q?"},
                            input_responses=answers,
                            request_state=pending.request_state,
                            allow_input_required=True,
                        )  # fmt: skip
                    )
                except MCPError as refused:
                    replies.append(refused.error)
            return replies

    with inline_gateway_with(server_env, logs / "input-wait.log", GATEWAY_INPUT_WAIT_SECONDS=str(wait)) as gateway:
        eventually(lambda: name in run(lambda: tool_names(gateway.url, world.key)))
        done, replayed = run(lambda: answered(gateway, 2))
        [late] = run(lambda: answered(gateway, 1, once_expired=True))
    assert done.content[0].text == 'accept: {"answer": "x"}'
    assert (replayed.code, replayed.message) == (
        types.INVALID_PARAMS,
        f"This requestState is no longer open (answered, expired, or held by another gateway process): "
        f"call {name} again without it.",
    )
    assert (late.code, late.message) == (
        types.INVALID_PARAMS,
        f"This requestState has expired: call {name} again without it.",
    )
