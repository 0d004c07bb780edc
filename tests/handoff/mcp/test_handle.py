"""The MCP layer's entry, `handle(message, session, caller)`, driven as a transport drives it, in this process:
no transport, no SDK session loop; the inline executor runs the demo upstream on this process's pool."""

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import anyio
from mcp import types

from handoff.mcp.caller import Caller
from handoff.mcp.handle import McpSession, handle
from handoff.mcp.server import server
from tests import servers
from tests.helpers import audit_mark, audit_since, snapshot_current, until

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {"elicitation": {}},
        "clientInfo": {"name": "layer-tests", "version": "1"},
    },
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}


def _message(frame: dict) -> types.JSONRPCMessage:
    return types.jsonrpc_message_adapter.validate_python(frame, by_name=False)


def _dumped(message: types.JSONRPCMessage) -> dict:
    return message.model_dump(by_alias=True, exclude_unset=True, mode="json")


class Agent:
    """One session as a transport holds it: what comes back for each message, and what is pushed outside any."""

    def __init__(self, caller: Caller) -> None:
        self.pushed: list[dict] = []
        self.session = McpSession(self._push, id=f"test-{uuid.uuid4().hex}")
        self.caller = caller

    async def _push(self, message: types.JSONRPCMessage) -> None:
        self.pushed.append(_dumped(message))

    async def replies(self, frame: dict) -> list[dict]:
        return [_dumped(reply) async for reply in handle(_message(frame), self.session, self.caller)]

    def stream(self, frame: dict) -> AsyncIterator[types.JSONRPCMessage]:
        return handle(_message(frame), self.session, self.caller)

    async def initialized(self) -> dict:
        [reply] = await self.replies(INITIALIZE)
        assert await self.replies(INITIALIZED) == []
        return reply


def _call(request_id: Any, name: str, arguments: dict, meta: dict | None = None) -> dict:
    params = {"name": name, "arguments": arguments} | ({"_meta": meta} if meta else {})
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def _run(scenario) -> Any:
    async def current_then_scenario() -> Any:
        await snapshot_current()
        return await scenario()

    return anyio.run(current_then_scenario)


def test_the_handshake_answers_as_the_gateway_and_commits_the_version(caller):
    async def scenario() -> tuple[dict, list[dict]]:
        agent = Agent(caller)
        return await agent.initialized(), await agent.replies({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})

    handshake, [listed] = _run(scenario)
    assert handshake["id"] == 0
    assert handshake["result"]["protocolVersion"] == "2025-11-25"
    assert handshake["result"]["serverInfo"]["name"] == "switchboard"
    assert handshake["result"]["capabilities"]["tools"] == {"listChanged": True}
    assert {"layer__echo", "layer__add"} <= {tool["name"] for tool in listed["result"]["tools"]}


def test_a_method_before_the_handshake_is_refused_and_an_unknown_one_is_method_not_found(caller):
    async def scenario() -> tuple[list[dict], list[dict]]:
        agent = Agent(caller)
        early = await agent.replies({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        await agent.initialized()
        return early, await agent.replies({"jsonrpc": "2.0", "id": 2, "method": "tools/frobnicate"})

    [early], [unknown] = _run(scenario)
    assert early == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {"code": types.INVALID_PARAMS, "message": "Invalid request parameters", "data": ""},
    }
    assert unknown["error"]["code"] == types.METHOD_NOT_FOUND
    assert unknown["error"]["message"] == "Method not found"


def test_a_call_is_answered_decided_and_audited(caller):
    mark = audit_mark()

    async def scenario() -> list[dict]:
        agent = Agent(caller)
        await agent.initialized()
        return await agent.replies(_call(7, "layer__echo", {"text": "through handle"}))

    [reply] = _run(scenario)
    assert reply["id"] == 7
    assert reply["result"]["content"] == [{"type": "text", "text": "through handle"}]
    kinds = [(row.kind, row.agent_name, row.tool) for row in audit_since(mark)]
    assert kinds == [("approved", "layer-agent", "echo"), ("completed", "layer-agent", "echo")]


def test_progress_comes_out_ahead_of_the_reply_on_the_requests_own_stream(caller):
    async def scenario() -> list[dict]:
        agent = Agent(caller)
        await agent.initialized()
        return await agent.replies(_call(3, "layer__progress", {"seconds": 0.3}, {"progressToken": "p-3"}))

    replies = _run(scenario)
    *notes, reply = replies
    assert reply["id"] == 3 and reply["result"]["content"][0]["text"] == "done"
    assert notes and {note["method"] for note in notes} == {"notifications/progress"}
    assert {note["params"]["progressToken"] for note in notes} == {"p-3"}


def test_an_upstreams_question_goes_to_the_agent_and_its_answer_comes_back_in_through_handle(caller):
    async def scenario() -> tuple[dict, dict]:
        agent = Agent(caller)
        await agent.initialized()
        stream = agent.stream(_call(4, "layer__ask", {"question": "Which colour?"}))
        question = _dumped(await anext(stream))
        answer = {"action": "accept", "content": {"answer": "teal"}}
        assert await agent.replies({"jsonrpc": "2.0", "id": question["id"], "result": answer}) == []
        [reply] = [_dumped(message) async for message in stream]
        return question, reply

    question, reply = _run(scenario)
    assert question["method"] == "elicitation/create"
    assert question["params"]["message"] == "Which colour?"
    assert reply["id"] == 4
    assert reply["result"]["content"][0]["text"] == 'accept: {"answer": "teal"}'


def test_a_cancelled_request_is_never_answered_and_the_session_goes_on(caller):
    mark = f"handle-{uuid.uuid4().hex[:12]}"

    async def scenario() -> tuple[list[dict], list[dict]]:
        agent = Agent(caller)
        await agent.initialized()
        replies: list[dict] = []

        async def sleeper() -> None:
            replies.extend(
                [_dumped(m) async for m in agent.stream(_call(5, "layer__sleep", {"seconds": 30, "mark": mark}))]
            )

        async with anyio.create_task_group() as group:
            group.start_soon(sleeper)
            await until(lambda: servers.demo_started(mark), timeout=10)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}
            assert await agent.replies(cancel) == []
        return replies, await agent.replies(_call(6, "layer__echo", {"text": "still here"}))

    cancelled, [after] = _run(scenario)
    assert cancelled == []
    assert after["result"]["content"] == [{"type": "text", "text": "still here"}]


def test_a_session_opened_with_the_2026_envelope_is_served_per_request_and_refuses_the_handshake(caller):
    async def scenario() -> tuple[list[dict], list[dict]]:
        agent = Agent(caller)
        called = await agent.replies(_call(1, "layer__echo", {"text": "modern"}, ENVELOPE))
        return called, await agent.replies(INITIALIZE)

    [called], [handshake] = _run(scenario)
    assert called["result"]["resultType"] == "complete"
    assert called["result"]["content"] == [{"type": "text", "text": "modern"}]
    assert handshake["error"]["code"] == types.UNSUPPORTED_PROTOCOL_VERSION
    assert handshake["error"]["message"] == (
        "this session serves the 2026-07-28 protocol; the initialize handshake is not accepted"
    )
    assert handshake["error"]["data"] == {"supported": ["2026-07-28"], "requested": "2025-11-25"}


def test_a_2025_session_refuses_a_request_carrying_the_2026_envelope(caller):
    async def scenario() -> list[dict]:
        agent = Agent(caller)
        await agent.initialized()
        return await agent.replies(_call(2, "layer__echo", {"text": "mixed"}, ENVELOPE))

    [refused] = _run(scenario)
    assert refused["error"] == {
        "code": types.INVALID_REQUEST,
        "message": "this session serves the handshake protocol era (2025-11-25); requests carrying the "
        "2026-07-28 envelope are not accepted on it",
    }


def test_a_malformed_2026_envelope_is_refused_with_the_ladders_error(caller):
    async def scenario() -> list[dict]:
        agent = Agent(caller)
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}  # no client capabilities
        return await agent.replies(_call(1, "layer__echo", {"text": "x"}, meta))

    [refused] = _run(scenario)
    assert refused["error"]["code"] == types.INVALID_PARAMS
    assert "clientCapabilities" in refused["error"]["message"]


def test_closing_the_session_releases_a_question_no_one_will_answer(caller):
    async def scenario() -> list[dict]:
        agent = Agent(caller)
        await agent.initialized()
        stream = agent.stream(_call(8, "layer__ask", {"question": "Anyone?"}))
        assert _dumped(await anext(stream))["method"] == "elicitation/create"
        await agent.session.close()
        return [_dumped(message) async for message in stream]

    assert _run(scenario) == []


def test_an_unexpected_failure_is_an_internal_error_that_names_nothing_inside(caller, monkeypatch):
    async def broken(ctx, params):
        raise RuntimeError("secret detail from inside")

    # A handler that fails in a way no input should reach (a bug): patched in, as no real input reaches one.
    entry = server.get_request_handler("tools/list")
    monkeypatch.setitem(server._request_handlers, "tools/list", replace(entry, handler=broken))

    async def scenario() -> list[dict]:
        agent = Agent(caller)
        await agent.initialized()
        return await agent.replies({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})

    [failed] = _run(scenario)
    assert failed["error"] == {"code": types.INTERNAL_ERROR, "message": "Internal server error"}


def test_what_a_handler_registers_on_its_2026_requests_connection_is_unwound_before_the_reply(caller, monkeypatch):
    unwound: list[str] = []
    entry = server.get_request_handler("tools/list")

    async def registering(ctx, params):
        # The SDK's per-connection cleanup hook; no handler of the gateway's uses it, so one is patched in.
        ctx.session._connection.exit_stack.callback(unwound.append, "unwound")
        return await entry.handler(ctx, params)

    monkeypatch.setitem(server._request_handlers, "tools/list", replace(entry, handler=registering))

    async def scenario() -> tuple[dict, list[str]]:
        agent = Agent(caller)
        stream = agent.stream({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE}})
        listed = _dumped(await anext(stream))
        seen = list(unwound)  # as the reply came out
        assert [message async for message in stream] == []
        return listed, seen

    listed, seen = _run(scenario)
    assert listed["result"]["resultType"] == "complete"
    assert seen == ["unwound"]
