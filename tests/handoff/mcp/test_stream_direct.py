"""`/mcp`'s requests run straight into their event stream (exchange.run over handle.start: no queue, no drain
task): what goes into the stream is, frame for frame, what `handle` yields for the same request (the path
/mcp/ws takes), for an answer, a tool's error, an unknown tool, bad params and progress; a cancelled one ends
its 2025-11-25 stream with the SDK transport's REQUEST_CANCELLED reply, and its 2026-07-28 one with nothing."""

import re
import uuid
from functools import partial

import anyio
from mcp.server.streamable_http import REQUEST_CANCELLED

from handoff.endpoints.streamable_http import exchange
from handoff.endpoints.streamable_http.streams import EventStream
from handoff.mcp.frames import encode_message
from handoff.mcp.handle import handle
from tests import servers
from tests.handoff.mcp.test_handle import ENVELOPE, Agent, _call, _message, _run
from tests.helpers import until

CALL_ID = re.compile(r'"requestId":"[0-9a-f-]{36}"')
REQUESTS = [
    _call(1, "layer__echo", {"text": "straight in"}),
    _call(2, "layer__fail", {}),
    _call(3, "layer__nothing_here", {}),
    {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": 7, "arguments": "not an object"}},
    _call(5, "layer__progress", {"seconds": 0.2}, {"progressToken": "p-5"}),
]


async def _streamed(agent: Agent, frame: dict) -> list[tuple[str, bool]]:
    stream = EventStream("")
    exchange.run(_message(frame), agent.session, agent.caller, stream, reply_always=True)
    return [(event.data, event.final) async for event in stream.events(0)]


async def _handled(agent: Agent, frame: dict) -> list[tuple[str, bool]]:
    frames = [encode_message(message) async for message in handle(_message(frame), agent.session, agent.caller)]
    return [(data, n == len(frames) - 1) for n, data in enumerate(frames)]


def _comparable(frames: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Progress notes are as many as the upstream's timing makes them: their kind is compared, not their count;
    a denial's requestId is each call's own."""
    kept = {(CALL_ID.sub("<call>", data), final) if final else ("progress", False) for data, final in frames}
    return sorted(kept, key=lambda frame: frame[1])


def test_a_requests_frames_in_its_stream_are_those_handle_yields(caller):
    async def scenario() -> list[tuple[list, list]]:
        agent = Agent(caller)
        await agent.initialized()
        return [(await _streamed(agent, frame), await _handled(agent, frame)) for frame in REQUESTS]

    compared = _run(scenario)
    for streamed, handled in compared:
        assert _comparable(streamed) == _comparable(handled)
    (echo, _), (fail, _), (unknown, _), (bad, _), (progressed, _) = compared
    assert len(echo) == 1 and echo[0][1] and '"text":"straight in"' in echo[0][0]
    assert '"isError":true' in fail[-1][0]
    assert '"id":3' in unknown[-1][0] and "layer__nothing_here" in unknown[-1][0]
    invalid = '{"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"Invalid request parameters","data":""}}'
    assert bad == [(invalid, True)]
    assert len(progressed) > 1 and '"method":"notifications/progress"' in progressed[0][0] and progressed[-1][1]


def test_a_cancelled_request_ends_its_stream_with_request_cancelled_only_on_the_2025_wire(caller):
    async def scenario() -> list[list[tuple[str, bool]]]:
        ended = []
        for reply_always, meta in ((True, None), (False, ENVELOPE)):
            agent = Agent(caller)
            if meta is None:
                await agent.initialized()
            stream = EventStream("")
            mark = f"direct-{uuid.uuid4().hex[:12]}"
            request = _message(_call(9, "layer__sleep", {"seconds": 30, "mark": mark}, meta))
            running = exchange.run(request, agent.session, agent.caller, stream, reply_always)
            await until(partial(servers.demo_started, mark), timeout=10)  # the upstream is in it: cancelling stops it
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}}
            with anyio.fail_after(10):
                assert [m async for m in handle(_message(cancel), agent.session, agent.caller)] == []
                ended.append([(event.data, event.final) async for event in stream.events(0)])
            assert running.closed and not exchange.running
        return ended

    legacy, modern = _run(scenario)
    cancelled = f'"error":{{"code":{REQUEST_CANCELLED},"message":"Request cancelled"}}'
    assert len(legacy) == 1 and cancelled in legacy[0][0] and legacy[0][1]
    assert modern == []
