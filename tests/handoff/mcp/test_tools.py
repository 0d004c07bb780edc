"""The MCP layer's tools/list and tools/call handlers, called directly in this process: no transport and no SDK
server underneath, the inline executor running the demo upstream on this process's pool."""

from types import SimpleNamespace

import anyio
import pytest
from mcp import types
from mcp.shared.exceptions import MCPError

from handoff.mcp.caller import Caller
from handoff.mcp.tools import call_tool, list_tools
from handoff.snapshot import snapshot
from tests.helpers import audit_mark, audit_since, snapshot_current


def _ctx(caller: Caller, request_id: int = 1) -> SimpleNamespace:
    """What a handler reads of its request: who asks, in which era, and a client that declared nothing."""
    session = SimpleNamespace(client_capabilities=None)
    return SimpleNamespace(
        request=caller, request_id=request_id, protocol_version="2025-11-25", session=session, params={}, meta=None
    )


def _called(caller: Caller, name: str, arguments: dict) -> dict:
    async def calling() -> dict:
        await snapshot_current()
        return await call_tool(_ctx(caller), types.CallToolRequestParams(name=name, arguments=arguments))

    return anyio.run(calling)


def test_a_call_is_decided_run_and_audited_with_its_approval_and_completion(caller):
    mark = audit_mark()
    result = _called(caller, "layer__echo", {"text": "through the layer"})
    assert result["content"] == [{"type": "text", "text": "through the layer"}]
    rows = [(r.kind, r.agent_name, r.upstream, r.tool, r.error_code) for r in audit_since(mark)]
    assert rows == [
        ("approved", "layer-agent", "layer", "echo", ""),
        ("completed", "layer-agent", "layer", "echo", ""),
    ]


def test_an_unknown_tool_is_refused_with_its_name_and_audited(caller):
    mark = audit_mark()
    with pytest.raises(MCPError) as refused:
        _called(caller, "layer__nonexistent", {})
    assert refused.value.error.code == types.INVALID_PARAMS
    assert refused.value.error.data["code"] == "TOOL_NOT_FOUND"
    assert refused.value.error.message == (
        "Unknown tool: 'layer__nonexistent'. Call tools/list for the tools this gateway offers."
    )
    [denied] = audit_since(mark)
    assert (denied.kind, denied.error_code, denied.exposed_name) == ("denied", "TOOL_NOT_FOUND", "layer__nonexistent")


def test_tools_list_offers_the_agent_its_tools_by_their_exposed_names(caller):
    async def listing() -> dict:
        await snapshot_current()
        return await list_tools(_ctx(caller), None)

    names = {tool["name"] for tool in anyio.run(listing)["tools"]}
    assert {"layer__echo", "layer__add"} <= names


def test_a_call_whose_step_after_execute_fails_gets_its_completion_row_and_a_gateway_error(caller, monkeypatch):
    def broken(name: str, outcome: dict) -> dict:
        raise RuntimeError("the result could not be shaped")

    monkeypatch.setattr("handoff.mcp.pipeline.execute.for_model", broken)
    mark = audit_mark()
    with pytest.raises(MCPError) as failed:
        _called(caller, "layer__echo", {"text": "ran, then failed"})
    assert failed.value.error.code == types.INTERNAL_ERROR
    assert failed.value.error.data["code"] == "GATEWAY_ERROR"
    assert failed.value.error.message == (
        "The gateway failed after the service answered: this call ran, but its result is withheld. "
        "Check before repeating it."
    )
    rows = [(r.kind, r.outcome, r.error_code, r.error_detail) for r in audit_since(mark)]
    assert rows == [
        ("approved", "", "", ""),
        ("completed", "error", "GATEWAY_ERROR", "RuntimeError('the result could not be shaped')"),
    ]
    assert str(failed.value.error.data["requestId"]) == str(audit_since(mark)[1].request_id)
    monkeypatch.undo()  # the admission went back: the next call is served
    assert _called(caller, "layer__echo", {"text": "again"})["content"] == [{"type": "text", "text": "again"}]


def test_a_tools_list_is_fresh_until_the_snapshot_is_looked_at_again_and_stale_once_a_change_is_told(caller, settings):
    settings.GATEWAY_SNAPSHOT_CHECK_SECONDS = 3600

    async def listing() -> tuple[int, int]:
        await snapshot_current()
        snapshot.invalidate()  # the next read looks at the version: the list is served from a snapshot just checked
        listed = await list_tools(_ctx(caller), None)
        snapshot.invalidate()  # a change told by another process
        return listed["ttlMs"], snapshot.fresh_ms()

    fresh, after_a_change = anyio.run(listing)
    assert 3_500_000 < fresh <= 3_600_000
    assert after_a_change == 0
