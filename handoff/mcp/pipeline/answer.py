"""The answer stage for an agent: the result as its era wants it, or the JSON-RPC error of a refusal; a refusal
that lifts once the person connects an account asks them to (personal_access.py), one they may sign off in their
own client asks them that (sign_off.py); a lost handoff tunnel ends the handoff."""

from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from handoff.mcp.caller import legacy_agent
from handoff.mcp.personal_access import CONNECT_AGAIN, CONNECTED, connect_ask, connect_refusal
from handoff.mcp.pipeline.call import Call
from handoff.mcp.pipeline.execute import AFTER_EXECUTE_FAILED
from handoff.mcp.pipeline.rows import denial_error
from handoff.mcp.pipeline.sign_off import form_round
from handoff.protocol.moves import HANDOFF_FAILED, tunnel_gone
from policy.decisions import Denial
from policy.redaction import redact
from registry.upstreams.outcome import MISSING_CLIENT_CAPABILITY, TUNNEL_GONE


def finish(ctx: ServerRequestContext, result: dict[str, Any]) -> dict[str, Any]:
    """The SDK fills cache hints and validates, but a plain-dict result must carry its own 2026 `resultType`."""
    if not legacy_agent(ctx):
        return {"resultType": "complete"} | result  # an input-required result keeps its own
    return result


async def agent_answer(call: Call) -> dict[str, Any]:
    assert call.ctx is not None and call.caller is not None
    if call.denial:
        return _refused(call, call.denial)
    outcome, route = call.outcome, call.route
    assert outcome is not None and call.result is not None
    if call.after_failed:
        data = {"code": "GATEWAY_ERROR", "requestId": str(call.request_id)}
        raise MCPError(types.INTERNAL_ERROR, AFTER_EXECUTE_FAILED, data)
    if call.tunnel is not None and not call.own and outcome.get("code") == TUNNEL_GONE:
        await tunnel_gone(call.caller, call.tunnel, TUNNEL_GONE)
        message = (
            f"The {call.tunnel.domain} specialist's connection was lost, so the handoff has ended and your "
            "own tools are restored (call tools/list). The call may not have run."
        )
        raise MCPError(HANDOFF_FAILED, message, {"code": TUNNEL_GONE, "requestId": str(call.request_id)})
    code = outcome.get("code", "")
    if route is not None and route.per_person in CONNECTED and code in CONNECT_AGAIN:  # unusable after all
        return _refused(call, connect_refusal(code, call.caller, route, call.name))
    if outcome.get("rpc_code") == MISSING_CLIENT_CAPABILITY:  # the agent's client, not its model, must act
        raise MCPError(MISSING_CLIENT_CAPABILITY, redact(outcome["message"]), outcome.get("rpc_data"))
    return finish(call.ctx, call.result)


def _refused(call: Call, denial: Denial) -> dict[str, Any]:
    assert call.ctx is not None and call.caller is not None
    if (form := form_round(call, denial)) is not None:  # the caller signs off in their own client
        return finish(call.ctx, form.model_dump(mode="json", by_alias=True, exclude_none=True))
    if not denial.connect_url:
        raise denial_error(denial, call.request_id)
    asked = connect_ask(call.ctx, call.caller, call.name, call.upstream, denial, str(call.request_id))
    if isinstance(asked, MCPError):
        raise asked
    return finish(call.ctx, asked.model_dump(mode="json", by_alias=True, exclude_none=True))
