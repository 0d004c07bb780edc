"""tools/list and tools/call through a real gateway, in both protocol eras, over both executors."""

import pytest

from tests.clients import sdk_client, ws_session
from tests.helpers import ancestors, audit_mark, audit_since, run, server_pid

MODES = ["legacy", "2026-07-28"]
EXPECTED_VERSION = {"legacy": "2025-11-25", "2026-07-28": "2026-07-28"}


@pytest.mark.parametrize("mode", MODES)
def test_sdk_client_lists_and_calls_tools_of_two_upstreams(gateway, world, mode):
    async def scenario():
        async with sdk_client(gateway.url, world.key, mode) as client:
            listed = await client.list_tools()
            now = await client.call_tool("time__get_current_time", {"timezone": "Asia/Tokyo"})
            echo = await client.call_tool("every__echo", {"message": "through the gateway"})
            return client.protocol_version, listed, now, echo

    version, listed, now, echo = run(scenario)
    assert version == EXPECTED_VERSION[mode]
    names = {tool.name for tool in listed.tools}
    assert {"time__get_current_time", "time__convert_time", "every__echo", "every__get-sum", "demo__add"} <= names
    assert all("__" in name for name in names)
    assert not now.is_error and now.structured_content["timezone"] == "Asia/Tokyo"
    assert echo.content[0].text == "Echo: through the gateway"


def test_listed_tools_keep_the_upstream_descriptions_and_schemas(inline_gateway, world):
    async def scenario():
        async with sdk_client(inline_gateway.url, world.key, "legacy") as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = run(scenario)
    add = tools["demo__add"]
    assert add.description == "Add two numbers."
    assert add.input_schema["required"] == ["a", "b"]


def test_the_executor_that_runs_calls_is_the_configured_one(gateway, world):
    async def scenario():
        async with sdk_client(gateway.url, world.key, "legacy") as client:
            return server_pid((await client.call_tool("demo__pid", {})).content[0].text)

    upstream_pid = run(scenario)
    # Inline: the gateway process spawned the stdio upstream. Celery: the worker did (its sandbox's bwrap between).
    above = ancestors(upstream_pid)
    assert gateway.executor_pid in above
    assert (gateway.process.pid in above) == (gateway.process.pid == gateway.executor_pid)


def test_websocket_lists_and_calls_tools_of_two_upstreams(gateway, world):
    async def scenario():
        async with ws_session(gateway.url, world.key) as ws:
            listed = await ws.request("tools/list")
            now = await ws.request(
                "tools/call", {"name": "time__get_current_time", "arguments": {"timezone": "Europe/Paris"}}
            )
            echo = await ws.request("tools/call", {"name": "every__echo", "arguments": {"message": "ws"}})
            return listed, now, echo

    listed, now, echo = run(scenario)
    names = {tool["name"] for tool in listed["result"]["tools"]}
    assert {"time__get_current_time", "every__echo"} <= names
    assert now["result"]["structuredContent"]["timezone"] == "Europe/Paris"
    assert echo["result"]["content"][0]["text"] == "Echo: ws"


def test_a_tool_error_reaches_the_model_as_an_error_result(inline_gateway, world):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(inline_gateway.url, world.key, "legacy") as client:
            return await client.call_tool("demo__fail", {})

    result = run(scenario)
    assert result.is_error and result.content[0].text == "this tool always fails"
    completed = [e for e in audit_since(mark) if e.kind == "completed"]
    assert [(e.outcome, e.error_code) for e in completed] == [("error", "TOOL_ERROR")]


def test_upstream_crash_mid_call_gives_an_error_result_and_the_next_call_works(gateway, world):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(gateway.url, world.key, "legacy") as client:
            before = (await client.call_tool("demo__pid", {})).content[0].text
            crashed = await client.call_tool("demo__crash", {})
            after = (await client.call_tool("demo__pid", {})).content[0].text
            return before, crashed, after

    before, crashed, after = run(scenario)
    assert crashed.is_error
    assert crashed.content[0].text == (
        "demo__crash: The service's process exited with status 3 during the call; it is being restarted. "
        "The call may or may not have run: retry only if it is safe to repeat."
    )
    assert before != after, "the stdio server should have been restarted"
    crash_rows = [e for e in audit_since(mark) if e.kind == "completed" and e.tool == "crash"]
    assert len(crash_rows) == 1
    assert (crash_rows[0].outcome, crash_rows[0].error_code) == ("error", "UPSTREAM_UNAVAILABLE")
    assert crash_rows[0].error_detail  # the full story stays in the audit


def test_a_call_over_the_upstream_timeout_is_cut_off(gateway, world):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(gateway.url, world.key, "legacy") as client:
            return await client.call_tool("slow__sleep", {"seconds": 4})

    result = run(scenario)
    assert result.is_error
    assert result.content[0].text == "slow__sleep: The service did not answer within 1 seconds."
    row = next(e for e in audit_since(mark) if e.kind == "completed")
    assert (row.outcome, row.error_code) == ("timeout", "UPSTREAM_TIMEOUT")


def test_a_call_longer_than_the_redis_socket_timeout_completes_through_celery(celery_gateway, world):
    """redis-py gives up on a socket after 5 s by default; the reply wait must not."""

    async def scenario():
        async with sdk_client(celery_gateway.url, world.key, "legacy", timeout=15) as client:
            return await client.call_tool("demo__sleep", {"seconds": 6})

    result = run(scenario)
    assert not result.is_error and result.content[0].text == "slept"


def test_with_no_worker_the_agent_gets_a_specific_error_not_a_hang(workerless_gateway, world):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(workerless_gateway.url, world.key, "legacy", timeout=20) as client:
            return await client.call_tool("slow__sleep", {"seconds": 0})

    result = run(scenario)
    assert result.is_error
    assert result.content[0].text == (
        "slow__sleep: No answer from the gateway's workers in time: the call may or may not have run. "
        "Check its effect before repeating it."
    )
    row = next(e for e in audit_since(mark) if e.kind == "completed")
    assert (row.outcome, row.error_code, row.error_detail) == (
        "error",
        "EXECUTOR_UNAVAILABLE",
        "no reply from an executor within 7s",
    )


@pytest.mark.parametrize(
    ("tool", "code", "message"),
    [
        # The agent speaks 2025-11-25, so its call does too: the SDK's server tells its exception's words in that era
        # ("Internal server error" in 2026-07-28), the gateway's redaction applied.
        (
            "demo__raise",
            "UPSTREAM_ERROR",
            "demo__raise: The service refused the request: the demo server failed on purpose",
        ),
        ("demo__bad_output", "UPSTREAM_INVALID_RESPONSE", "demo__bad_output: The service sent a malformed response."),
    ],
)
def test_an_upstream_that_misbehaves_gives_an_error_result_and_a_completion_row(gateway, world, tool, code, message):
    mark = audit_mark()

    async def scenario():
        async with sdk_client(gateway.url, world.key, "legacy") as client:
            return await client.call_tool(tool, {})

    result = run(scenario)
    assert result.is_error and result.content[0].text == message
    rows = audit_since(mark)
    assert [r.kind for r in rows] == ["approved", "completed"]
    assert (rows[1].outcome, rows[1].error_code) == ("error", code) and rows[1].error_detail
