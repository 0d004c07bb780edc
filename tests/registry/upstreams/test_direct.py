"""A plain tools/call to a stdio server by the connection's direct line (registry/upstreams/direct.py), in this
process: what it sends, and every way its answer can go wrong, each as the SDK session's way says it."""

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from registry.upstreams.direct import _plain
from registry.upstreams.pool import UpstreamPool
from registry.upstreams.requests import UpstreamRequest
from registry.upstreams.spec import UpstreamSpec
from tests.factories import DEMO_SPEC
from tests.helpers import until, with_pool

DEPTH = 64  # GATEWAY_MAX_JSON_DEPTH's default
SCRIPTED = str(Path(__file__).parents[2] / "support/scripted_upstream.py")


@pytest.fixture
def scripted(settings, tmp_path) -> tuple[UpstreamSpec, Path]:
    """The scripted server (unconfined: it writes what it reads to a file of the test's) and that file."""
    settings.GATEWAY_STDIO_SANDBOX = "off"
    seen = tmp_path / "seen.jsonl"
    spec = UpstreamSpec(
        id=3,
        revision=1,
        slug="scripted",
        transport="stdio",
        timeout=1,
        command=sys.executable,
        args=[SCRIPTED, str(seen)],
    )
    return spec, seen


def _call(tool: str, arguments: dict[str, Any] | None = None, **rest: Any) -> UpstreamRequest:
    return UpstreamRequest.tool_call(3, 1, tool, arguments or {}, **rest)


def _received(seen: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in seen.read_text().splitlines()]


def test_a_plain_call_is_written_by_the_direct_line_with_the_gateways_traceparent(scripted):
    spec, seen = scripted
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    outcome = with_pool(spec, lambda pool: pool.request(_call("id", {"n": 1}, traceparent=traceparent)))
    text = {"type": "text", "text": '"switchboard-1"'}
    assert outcome == {"ok": True, "result": {"content": [text], "isError": False, "resultType": "complete"}}
    [sent] = [m for m in _received(seen) if m.get("method") == "tools/call"]
    assert sent == {
        "jsonrpc": "2.0",
        "id": "switchboard-1",
        "method": "tools/call",
        "params": {"name": "id", "arguments": {"n": 1}, "_meta": {"traceparent": traceparent}},
    }


def test_an_error_answer_is_the_upstreams_refusal_with_its_code(scripted):
    outcome = with_pool(scripted[0], lambda pool: pool.request(_call("error")))
    assert outcome == {
        "ok": False,
        "code": "UPSTREAM_ERROR",
        "message": "The service refused the request: no such record",
        "detail": "MCPError(-32010, 'no such record', {'record': 7})",
        "rpc_code": -32010,
    }


def test_an_upstreams_own_error_in_the_sdks_closed_code_is_its_refusal_and_the_connection_serves_on(scripted):
    async def twice(pool):
        return await pool.request(_call("server_error")), await pool.request(_call("id"))

    refused, answered = with_pool(scripted[0], twice)
    assert refused == {
        "ok": False,
        "code": "UPSTREAM_ERROR",
        "message": "The service refused the request: the database is down",
        "detail": "MCPError(-32000, 'the database is down', None)",
        "rpc_code": -32000,
    }
    assert answered["result"]["content"] == [{"type": "text", "text": '"switchboard-2"'}]


def _without_links(detail: str) -> str:
    """A pydantic error as it reads, without the links to its docs (they name pydantic's version)."""
    return "\n".join(line for line in detail.splitlines() if "errors.pydantic.dev" not in line)


BOTH_ARMS = "union[CallToolResult,function-after[_require_one_field(), InputRequiredResult]]"


# Results of the wrong shape, each refused by the check that knows it: the era's own schema (a list where an object
# goes, a 2026-07-28 result without its resultType) or the version-free result type the SDK session parses into
# (a null isError, a 2026-07-28 result with no content, which its era's schema reads as an input round).
@pytest.mark.parametrize(
    "era, result, detail",
    [
        (
            "2025-11-25",
            '{"content": "not a list"}',
            "1 validation error for CallToolResult\ncontent\n  Input should be a valid list "
            "[type=list_type, input_value='not a list', input_type=str]",
        ),
        (
            "2025-11-25",
            '{"content": [], "structuredContent": []}',
            "1 validation error for CallToolResult\nstructuredContent\n  Input should be a valid dictionary "
            "[type=dict_type, input_value=[], input_type=list]",
        ),
        (
            "2025-11-25",
            '{"content": [], "isError": null}',
            f"2 validation errors for {BOTH_ARMS}\nCallToolResult.isError\n  Input should be a valid boolean "
            "[type=bool_type, input_value=None, input_type=NoneType]\n"
            "function-after[_require_one_field(), InputRequiredResult]\n  Value error, InputRequiredResult requires "
            "at least one of input_requests or request_state [type=value_error, input_value={'content': [], "
            "'isError': None}, input_type=dict]",
        ),
        (
            "2026-07-28",
            '{"content": []}',
            "2 validation errors for union[CallToolResult,InputRequiredResult]\nCallToolResult.resultType\n"
            "  Field required [type=missing, input_value={'content': []}, input_type=dict]\n"
            "InputRequiredResult.resultType\n  Field required [type=missing, input_value={'content': []}, "
            "input_type=dict]",
        ),
        (
            "2026-07-28",
            '{"resultType": "complete"}',
            f"2 validation errors for {BOTH_ARMS}\nCallToolResult.content\n  Field required "
            "[type=missing, input_value={'resultType': 'complete'}, input_type=dict]\n"
            "function-after[_require_one_field(), InputRequiredResult].resultType\n  Input should be "
            "'input_required' [type=literal_error, input_value='complete', input_type=str]",
        ),
    ],
    ids=[
        "content that is no list",
        "structured content that is no object",
        "a null isError",
        "a 2026-07-28 result without its resultType",
        "a 2026-07-28 result without content",
    ],
)
def test_a_result_of_the_wrong_shape_is_a_malformed_response_saying_what_is_wrong(scripted, era, result, detail):
    spec = replace(scripted[0], args=[*scripted[0].args, era])
    line = f'{{"jsonrpc": "2.0", "id": @ID, "result": {result}}}'
    outcome = with_pool(spec, lambda pool: pool.request(_call("raw", {"lines": [line]})))
    assert (outcome["ok"], outcome["code"], outcome["message"]) == (
        False,
        "UPSTREAM_INVALID_RESPONSE",
        "The service sent a malformed response.",
    )
    assert _without_links(outcome["detail"]) == detail


SERVER_INFO = '"io.modelcontextprotocol/serverInfo": {"name": "s", "version": "1"}'


# A result leaves as the SDK's result type writes it, key for key in its order, without the upstream's serverInfo
# (its _meta last, and gone once nothing else is in it).
@pytest.mark.parametrize(
    "result, sent",
    [
        (
            f'{{"_meta": {{{SERVER_INFO}, "trace": "t"}}, "structuredContent": {{"n": 1}}, "resultType": "complete", '
            '"content": [{"text": "done", "type": "text", "annotations": {"priority": 0.5}}]}',
            '{"content": [{"type": "text", "text": "done", "annotations": {"priority": 0.5}}], '
            '"structuredContent": {"n": 1}, "isError": false, "resultType": "complete", "_meta": {"trace": "t"}}',
        ),
        (
            f'{{"content": [], "resultType": "complete", "_meta": {{{SERVER_INFO}}}}}',
            '{"content": [], "isError": false, "resultType": "complete"}',
        ),
        (
            '{"content": [], "resultType": "complete", "_meta": {}}',
            '{"content": [], "isError": false, "resultType": "complete"}',
        ),
    ],
    ids=["with structured content and a _meta of its own", "with serverInfo alone", "with an empty _meta"],
)
def test_a_2026_results_json_is_the_sdk_types_own_without_the_upstreams_server_info(scripted, result, sent):
    spec = replace(scripted[0], args=[*scripted[0].args, "2026-07-28"])
    line = f'{{"jsonrpc": "2.0", "id": @ID, "result": {result}}}'
    outcome = with_pool(spec, lambda pool: pool.request(_call("raw", {"lines": [line]})))
    assert json.dumps(outcome["result"]) == sent


def test_a_later_eras_fields_in_a_2025_11_25_answer_are_dropped_as_the_sdk_session_drops_them(scripted):
    outcome = with_pool(scripted[0], lambda pool: pool.request(_call("later")))
    text = {"type": "text", "text": "done"}
    assert outcome == {"ok": True, "result": {"content": [text], "isError": False, "resultType": "complete"}}


def test_a_line_that_is_no_json_leaves_the_call_to_its_timeout_and_the_connection_serves_on(scripted):
    async def body(pool: UpstreamPool) -> tuple[dict, dict]:
        return await pool.request(_call("malformed")), await pool.request(_call("id"))

    timed_out, served = with_pool(scripted[0], body)
    waited = "The service did not answer within 1 seconds."
    assert timed_out == {"ok": False, "code": "UPSTREAM_TIMEOUT", "message": waited, "detail": waited}
    assert served["result"]["content"][0]["text"] == '"switchboard-2"'


def _cancels(seen: Path) -> list[dict[str, Any]]:
    return [m["params"] for m in _received(seen) if m.get("method") == "notifications/cancelled"]


def test_a_call_past_its_timeout_is_cancelled_at_the_upstream_by_its_id(scripted):
    spec, seen = scripted

    async def body(pool: UpstreamPool) -> dict:
        outcome = await pool.request(_call("hang"))
        await until(lambda: _cancels(seen))  # written on the call's way out: the server reads it a moment later
        return outcome

    assert with_pool(spec, body)["code"] == "UPSTREAM_TIMEOUT"
    assert _cancels(seen) == [{"requestId": "switchboard-1", "reason": "caller cancelled"}]


def test_a_server_that_dies_before_answering_is_named_and_the_call_may_have_run(scripted):
    outcome = with_pool(scripted[0], lambda pool: pool.request(_call("die")))
    assert (outcome["code"], outcome["message"]) == (
        "UPSTREAM_UNAVAILABLE",
        "The service's process exited with status 7 during the call; it is being restarted. "
        "The call may or may not have run: retry only if it is safe to repeat.",
    )
    assert outcome["detail"] == "MCPError(-32000, 'Connection closed', None): the server exited with status 7"


def test_a_call_cancelled_by_its_caller_is_cancelled_at_the_upstream(scripted):
    spec, seen = scripted

    async def body(pool: UpstreamPool) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.request, _call("hang"))
            await until(lambda: any(c.in_flight for c in pool._connections.values()))
            tg.cancel_scope.cancel()
        await until(lambda: _cancels(seen))

    with_pool(spec, body)
    assert _cancels(seen) == [{"requestId": "switchboard-1", "reason": "caller cancelled"}]


def test_a_2026_upstreams_direct_answer_is_checked_against_the_tools_output_schema():
    outcome = with_pool(DEMO_SPEC, lambda pool: pool.request(UpstreamRequest.tool_call(1, 1, "bad_output", {})))
    assert (outcome["code"], outcome["message"]) == (
        "UPSTREAM_INVALID_RESPONSE",
        "The service sent a malformed response.",
    )
    assert outcome["detail"].startswith(
        "Invalid structured content returned by tool bad_output: 'not a number' is not of type 'integer'"
    )


def test_a_2026_upstreams_input_required_answer_is_driven_as_the_sdk_client_drives_its_own():
    """No agent to ask (a plain call carries no relay): the session's own callbacks refuse, as for an SDK call."""
    ask = UpstreamRequest.tool_call(1, 1, "ask", {"of": "elicitation", "question": "sure?"})
    outcome = with_pool(DEMO_SPEC, lambda pool: pool.request(ask))
    assert outcome == {
        "ok": False,
        "code": "UPSTREAM_ERROR",
        "message": "The service refused the request: Elicitation not supported",
        "detail": "MCPError(-32600, 'Elicitation not supported', None)",
        "rpc_code": -32600,
    }


def test_calls_in_flight_together_on_one_connection_each_get_their_own_answer():
    texts = [f"call {n}" for n in range(20)]

    async def body(pool: UpstreamPool) -> list[str]:
        answers: dict[str, str] = {}

        async def echo(text: str) -> None:
            outcome = await pool.request(UpstreamRequest.tool_call(1, 1, "echo", {"text": text}))
            answers[text] = outcome["result"]["content"][0]["text"]

        async with anyio.create_task_group() as tg:
            for text in texts:
                tg.start_soon(echo, text)
        assert len(pool._connections) == 1
        return [answers[text] for text in texts]

    assert with_pool(DEMO_SPEC, body) == texts


WAITED = "The service did not answer within 1 seconds."
TIMED_OUT = {"ok": False, "code": "UPSTREAM_TIMEOUT", "message": WAITED, "detail": WAITED}


def _refused(code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {
        "ok": False,
        "code": "UPSTREAM_ERROR",
        "message": f"The service refused the request: {message}",
        "detail": repr(MCPError(code, message, data)),
        "rpc_code": code,
    }


DEEP = (
    f"The upstream 'scripted' answered with JSON nested deeper than {DEPTH} levels, which the gateway does not pass on."
)
TOO_DEEP = {"ok": False, "code": "UPSTREAM_INVALID_RESPONSE", "message": DEEP, "detail": DEEP}


# Answers the direct line's own read leaves to the SDK's parse, each with what that parse made of it: the line it
# refuses goes to the session, and the call waits for its timeout; a member it coerces is read as it reads it.
@pytest.mark.parametrize(
    "line, outcome",
    [
        ('{"jsonrpc": "2.0", "id": @ID, "result": ["not an object"]}', TIMED_OUT),
        ('{"jsonrpc": "1.0", "id": @ID, "result": {"content": []}}', TIMED_OUT),
        ('{"jsonrpc": "2.0", "id": @ID, "result": {"content": [{"type": "text", "text": "\\ud800"}]}}', TIMED_OUT),
        ('{"jsonrpc": "2.0", "id": @ID, "error": {"code": -32010}}', TIMED_OUT),
        ('{"jsonrpc": "2.0", "id": @ID, "error": {"code": -32010, "message": 7}}', TIMED_OUT),
        ('{"jsonrpc": "2.0", "id": @ID, "error": {"code": "-32010", "message": "no"}}', _refused(-32010, "no")),
        ('{"jsonrpc": "2.0", "id": @ID, "error": {"code": -32010.0, "message": "no"}}', _refused(-32010, "no")),
        ('{"jsonrpc": "2.0", "id": @ID, "result": {}, "error": {"code": 5, "message": "both"}}', _refused(5, "both")),
        ('{"jsonrpc": "2.0", "id": @ID, "error": {"code": -32700, "message": "recursion limit exceeded"}}', TOO_DEEP),
    ],
    ids=[
        "a result that is no object",
        "another jsonrpc version",
        "a lone surrogate",
        "an error without a message",
        "an error message that is no string",
        "an error code in a string",
        "an error code that is a float",
        "both a result and an error",
        "the parse error of a reply too deep",
    ],
)
def test_an_answer_of_an_odd_shape_gets_what_the_sdks_parse_made_of_it(scripted, line, outcome):
    assert with_pool(scripted[0], lambda pool: pool.request(_call("raw", {"lines": [line]}))) == outcome


def test_an_answer_with_members_no_one_asked_for_is_read_without_them(scripted):
    content = '[{"type": "text", "text": "done", "extra": 1}]'
    answered = f'{{"jsonrpc": "2.0", "id": @ID, "result": {{"content": {content}, "extra": 2}}, "extra": 3}}'
    refused = '{"jsonrpc": "2.0", "id": @ID, "error": {"code": -32010, "message": "no", "data": [1], "extra": 1}}'

    async def both(pool: UpstreamPool) -> tuple[dict, dict]:
        return await pool.request(_call("raw", {"lines": [answered]})), await pool.request(
            _call("raw", {"lines": [refused]})
        )

    result, error = with_pool(scripted[0], both)
    assert result == {
        "ok": True,
        "result": {"content": [{"type": "text", "text": "done"}], "isError": False, "resultType": "complete"},
    }
    assert error == _refused(-32010, "no", [1])


def test_a_request_of_the_server_with_a_string_id_like_the_direct_lines_still_reaches_the_session(scripted):
    spec, seen = scripted
    ping = '{"jsonrpc": "2.0", "id": "switchboard-77", "method": "ping"}'
    answer = '{"jsonrpc": "2.0", "id": @ID, "result": {"content": []}}'

    async def body(pool: UpstreamPool) -> dict:
        outcome = await pool.request(_call("raw", {"lines": [ping, answer]}))
        await until(lambda: any(m.get("id") == "switchboard-77" for m in _received(seen)))
        return outcome

    assert with_pool(spec, body) == {"ok": True, "result": {"content": [], "isError": False, "resultType": "complete"}}
    assert [m for m in _received(seen) if m.get("id") == "switchboard-77"] == [
        {"jsonrpc": "2.0", "id": "switchboard-77", "result": {}}
    ]


@pytest.mark.parametrize("levels", [DEPTH - 2, 230], ids=["one level over", "beyond what the SDK parses"])
def test_a_direct_answer_nested_too_deep_is_refused_naming_the_upstream_and_the_next_call_is_served(levels):
    async def twice(pool: UpstreamPool) -> tuple[dict, dict]:
        deep = await pool.request(UpstreamRequest.tool_call(1, 1, "nested", {"levels": levels}))
        return deep, await pool.request(UpstreamRequest.tool_call(1, 1, "nested", {"levels": DEPTH - 3}))

    refused, served = with_pool(DEMO_SPEC, twice)
    message = (
        f"The upstream 'demo' answered with JSON nested deeper than {DEPTH} levels, which the gateway does not pass on."
    )
    assert refused == {"ok": False, "code": "UPSTREAM_INVALID_RESPONSE", "message": message, "detail": message}
    assert served["ok"] and json.dumps(served["result"]["structuredContent"]).count("[") == DEPTH - 3


AT_LIMIT = json.loads("[" * (DEPTH - 2) + "]" * (DEPTH - 2))  # under the message and its result: DEPTH levels


@pytest.mark.parametrize(
    "message, answer",
    [
        ({"jsonrpc": "2.0", "id": "switchboard-1", "result": {"content": []}, "extra": 1}, {"content": []}),
        (
            {"jsonrpc": "2.0", "id": "switchboard-1", "error": {"code": -32010, "message": "no", "data": [1], "x": 2}},
            types.ErrorData(code=-32010, message="no", data=[1]),
        ),
        ({"jsonrpc": "2.0", "id": "switchboard-1", "result": {"content": []}, "method": "ping"}, None),
        ({"jsonrpc": "2.0", "id": "switchboard-1", "result": {}, "error": {"code": 1, "message": "both"}}, None),
        ({"jsonrpc": "2.0", "id": "switchboard-1", "error": {"code": True, "message": "a bool"}}, None),
        ({"jsonrpc": "2.0", "id": "switchboard-1", "error": {"code": -32700, "message": "a parse error"}}, None),
        ({"jsonrpc": "2.0", "id": "switchboard-1", "result": {"value": AT_LIMIT}}, {"value": AT_LIMIT}),
        ({"jsonrpc": "2.0", "id": "switchboard-1", "result": {"value": [AT_LIMIT]}}, None),
        ({"jsonrpc": "2.0", "id": "switchboard-1", "result": {"value": [[]] * DEPTH}}, {"value": [[]] * DEPTH}),
        ({"jsonrpc": "2.0", "id": "switchboard-1", "result": {"text": "{[" * DEPTH}}, {"text": "{[" * DEPTH}),
    ],
    ids=[
        "a result",
        "an error",
        "a request's member",
        "both",
        "a code to coerce",
        "a parse error",
        "at the depth limit",
        "one level over",
        "more brackets than the limit side by side",
        "brackets in a string",
    ],
)
def test_the_direct_line_reads_by_itself_only_an_answer_the_sdks_parse_reads_as_it_is(message, answer):
    assert _plain(message, json.dumps(message)) == answer
