"""Properties of the MCP layer over generated input: any frame is answered with a JSON-RPC message or the
error docs/protocol.md names (with its code), and nothing an agent sends raises past `handle`, hangs it, or
makes a reply that cannot go out (conversation.py checks every message). In this process, against the real
database and Redis; the bounds are conftest.py's."""

import asyncio
import json
import math
from typing import Any

from django.conf import settings
from hypothesis import given
from hypothesis import strategies as st
from mcp import types

from handoff.mcp.caller import Caller
from tests.fuzz.checks import check_frame
from tests.fuzz.conftest import FUZZ
from tests.fuzz.conversation import Conversation
from tests.helpers import snapshot_current

HANDSHAKE = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "1"}}
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
METHODS = [
    "ping", "tools/list", "tools/call", "resources/list", "resources/templates/list", "resources/read",
    "resources/subscribe", "resources/unsubscribe", "prompts/list", "prompts/get", "completion/complete",
    "logging/setLevel", "initialize",
]  # fmt: skip
# The codes a request's error may carry here (docs/protocol.md's table; -32021: a capability the agent lacks).
CODES = {types.INVALID_REQUEST, types.METHOD_NOT_FOUND, types.INVALID_PARAMS, -32001, -32002, -32003, -32021}
KEYS = st.sampled_from(["name", "arguments", "uri", "cursor", "ref", "argument", "level", "_meta", "value"]) | st.text(
    max_size=8
)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4))


def frame(method: str, params: Any, request_id: Any = 1) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})


def session(
    loop: asyncio.Runner, caller: Caller, *texts: str, modern: bool = False
) -> list[list[types.JSONRPCMessage]]:
    """What comes back for each frame, after the handshake (a 2025-11-25 session) or in a 2026-07-28 one."""

    async def scenario() -> list[list[types.JSONRPCMessage]]:
        await snapshot_current()
        conversation = Conversation(caller)
        try:
            if not modern:
                await conversation.send(frame("initialize", HANDSHAKE, 0))
                await conversation.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            return [await conversation.send(text) for text in texts]
        finally:
            await conversation.close()

    return loop.run(scenario())


def error_of(replies: list[types.JSONRPCMessage]) -> types.ErrorData | None:
    final = replies[-1]
    if isinstance(final, types.JSONRPCError):
        assert final.error.code in CODES and final.error.message, final
        return final.error
    return None


@FUZZ
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_any_bytes_or_text_is_a_message_or_a_json_rpc_error(raw):
    check_frame(raw)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error"]) | st.text(max_size=4),
        st.sampled_from(["2.0", "1.0", "tools/call", 0, -1, 2**70, True, ""]) | JSON,
        max_size=6,
    )
)
def test_any_object_is_a_message_or_a_json_rpc_error(payload):
    check_frame(json.dumps(payload))


@FUZZ
@given(st.sampled_from(METHODS), JSON, st.booleans())
def test_any_json_as_a_methods_params_is_answered_in_both_eras(loop, fuzz_agent, method, params, modern):
    if modern and isinstance(params, dict):
        params["_meta"] = ENVELOPE
    text = frame(method, params)
    if params is not None and not isinstance(params, dict):  # MCP has no positional params
        assert check_frame(text) is None
        return
    [replies] = session(loop, fuzz_agent, text, modern=modern)
    error_of(replies)


@FUZZ
@given(st.text(), st.booleans())
def test_any_tool_name_is_a_tool_error_or_invalid_params(loop, fuzz_agent, name, modern):
    meta = {"_meta": ENVELOPE} if modern else {}
    [replies] = session(loop, fuzz_agent, frame("tools/call", {"name": name, "arguments": {}} | meta), modern=modern)
    error = error_of(replies)
    assert error is None or error.code in {types.INVALID_PARAMS, -32001}, error


@FUZZ
@given(st.sampled_from(["tools/list", "resources/list", "prompts/list", "resources/templates/list"]), st.text())
def test_any_cursor_is_a_page_or_invalid_params(loop, fuzz_agent, method, cursor):
    [replies] = session(loop, fuzz_agent, frame(method, {"cursor": cursor}))
    error = error_of(replies)
    assert error is None or error.code == types.INVALID_PARAMS, error


@FUZZ
@given(st.sampled_from(["resources/read", "resources/subscribe", "resources/unsubscribe"]), st.text())
def test_any_uri_is_read_or_invalid_params(loop, fuzz_agent, method, uri):
    [replies] = session(loop, fuzz_agent, frame(method, {"uri": uri}))
    error = error_of(replies)
    assert error is None or error.code == types.INVALID_PARAMS, error


@FUZZ
@given(st.text(), st.dictionaries(st.text(max_size=8), st.text(max_size=20) | JSON, max_size=3))
def test_any_prompt_name_and_arguments_are_a_prompt_or_invalid_params(loop, fuzz_agent, name, arguments):
    [replies] = session(loop, fuzz_agent, frame("prompts/get", {"name": name, "arguments": arguments}))
    error = error_of(replies)
    assert error is None or error.code == types.INVALID_PARAMS, error


def nested(levels: int, kinds: list[bool], leaf: Any) -> Any:
    value = leaf
    for level in range(levels):
        value = [value] if kinds[level % len(kinds)] else {"n": value}
    return value


@FUZZ
@given(st.integers(min_value=-3, max_value=3), st.lists(st.booleans(), min_size=1, max_size=5), SCALARS)
def test_arguments_nested_near_the_depth_limit_are_served_at_it_and_a_parse_error_over_it(
    loop, fuzz_agent, offset, kinds, leaf
):
    limit = settings.GATEWAY_MAX_JSON_DEPTH
    levels = limit - 3 + offset  # the frame, its params and its arguments are three levels already
    text = frame(
        "tools/call", {"name": "fuzz__echo", "arguments": {"text": "deep", "extra": nested(levels, kinds, leaf)}}
    )
    if levels + 3 > limit:
        assert check_frame(text) is None
        return
    [replies] = session(loop, fuzz_agent, text)
    error = error_of(replies)
    assert error is None or error.code == types.INVALID_PARAMS, error


@FUZZ
@given(st.integers(min_value=settings.GATEWAY_MAX_JSON_DEPTH + 1, max_value=50_000), st.booleans())
def test_a_frame_nested_past_the_limit_is_a_parse_error_however_deep(levels, arrays):
    opening, closing = ("[", "]") if arrays else ('{"n":', "}")
    nested_params = opening * levels + "0" + closing * levels  # written out: json.dumps itself would recurse
    text = f'{{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {{"a": {nested_params}}}}}'
    assert check_frame(text) is None  # and not a RecursionError


def test_floats_json_allows_as_params_are_answered(loop, fuzz_agent):
    """NaN and the infinities: Python's JSON reads them, so an agent can send them."""
    texts = [
        frame("tools/call", {"name": "fuzz__add", "arguments": {"a": v, "b": 1}}, i)
        for i, v in enumerate((math.nan, math.inf, -math.inf))
    ]
    for replies in session(loop, fuzz_agent, *texts):
        error_of(replies)
