"""The frame stage of an agent's tools/call: the request object made from the request, and a 2026-07-28 agent's
input-required rounds sorted out before the call runs (input_required.py). A retry that answers a parked call
is no new call: it resumes that one. A retry after connecting an account runs the call afresh; one that answers
an upstream's own round carries its answers to it. A call that an upstream might ask something runs parked, as
a task that outlives this request. A 2025-11-25 client's call made as a task may become one (as_task.py); a
2026-07-28 call waiting for a sign-off becomes one of the Tasks extension where its request declares it
(tool_task.py)."""

import time
from collections.abc import Mapping
from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext

from audit.telemetry import DENIALS, log_fields_add
from handoff.mcp.agent_relay import AgentRelay
from handoff.mcp.audit_rows import record
from handoff.mcp.caller import Caller, caller_of, legacy_agent
from handoff.mcp.input_required import (
    InvalidRequestState,
    ParkedCall,
    park,
    parked_call,
    responses_of,
    state_load,
)
from handoff.mcp.personal_access import CONNECT_ROUND
from handoff.mcp.pipeline.answer import agent_answer
from handoff.mcp.pipeline.as_task import call_as_task, tasks_declared
from handoff.mcp.pipeline.call import Call, OwnRun
from handoff.mcp.pipeline.rows import call_audit, call_logged
from handoff.mcp.pipeline.run import call_serve
from handoff.mcp.pipeline.sign_off import FORM_ROUND, form_answered
from handoff.mcp.pipeline.tool_task import extension_declared, task_or_answer
from handoff.snapshot import snapshot
from registry.upstreams.relay import LOGGING


async def agent_call(
    ctx: ServerRequestContext, params: types.CallToolRequestParams, trace_id: str, own_tools: Mapping[str, OwnRun]
) -> Any:
    caller, relay = caller_of(ctx), AgentRelay(ctx)
    call = Call(params.name, params.arguments or {}, trace_id, caller=caller, ctx=ctx, relay=relay, own_tools=own_tools)
    log_fields_add(trace_id=trace_id, agent=caller.agent_name, tool=params.name)
    if legacy_agent(ctx):
        if params.task is not None and tasks_declared(ctx):
            return await call_as_task(call, params.task.ttl)
        return await call_serve(call, agent_answer)
    entry = (await snapshot.get()).tool(caller.who, params.name)
    upstream = entry.route.upstream_slug if entry else ""
    # Answers the agent sends unasked go to the upstream too (it may know what to do with them).
    call.rounds = {"inputResponses": responses_of(params)} if params.input_responses else {}
    if params.request_state is not None:  # it answers what an upstream asked
        state = await request_state_verified(
            caller, params.name, upstream, params.request_state, call.arguments, trace_id
        )
        if "c" in state:
            parked = parked_call(state, params.name)
            parked.answer(responses_of(params))
            return await parked.respond(ctx)
        if state.get("k") == FORM_ROUND:  # the caller answered the sign-off form: the call runs afresh
            await form_answered(state, responses_of(params))
        fresh = state.get("k") in (CONNECT_ROUND, FORM_ROUND)
        call.rounds = {} if fresh else {"requestState": state.get("s"), "inputResponses": responses_of(params)}
    answer = task_or_answer if extension_declared(ctx) else agent_answer  # a sign-off's wait as a task
    if not relay.capabilities - {LOGGING}:  # nothing it could be asked: no need to park
        return await call_serve(call, answer)

    def run(parked: ParkedCall) -> Any:
        call.relay = parked
        return call_serve(call, answer)

    return await park(ctx, caller, params.name, upstream, relay.capabilities, run)


async def request_state_verified(
    caller: Caller, name: str, upstream: str, request_state: str, arguments: dict[str, Any], trace_id: str = ""
) -> dict[str, Any]:
    """A retry's verified requestState; a forged, foreign or expired one is refused, audited and logged."""
    started = time.perf_counter()
    try:
        return state_load(caller, name, upstream, request_state)
    except InvalidRequestState as refused:
        DENIALS.labels("INVALID_REQUEST_STATE").inc()
        call = Call(name, arguments, trace_id, caller=caller, upstream=upstream, started=started)
        log_fields_add(request_id=str(call.request_id))
        message = refused.error.message
        fields = call_audit(call)
        await record(
            kind="denied", outcome="denied", error_code="INVALID_REQUEST_STATE", error_detail=message, **fields
        )
        call_logged(call, "denied", "INVALID_REQUEST_STATE")
        raise
