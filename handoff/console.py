"""The console's "Test this tool": an operator's call through the path an agent's takes (decided, admitted,
audited; handoff/mcp/pipeline/), made as the built-in agent `console` with the operator as every row's actor.

Why an agent of its own: the decision, the limits and the trail are per agent, and an operator is none. One
`console` agent, made on first use, holds no key (no client can call as it) and is excluded from nothing:
rules name it, its limits and its switch apply, and GATEWAY_POLICY_DEFAULT=deny refuses it until a rule
allows it. So it stays in the rule pickers, labelled as built in, and its page says what it is
(policy/builtin_agents.py). Each operator's calls count as a session of their own (group isolation, call
counts)."""

import uuid
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction
from mcp.shared.exceptions import MCPError

from audit.services import audit_record
from audit.telemetry import log_fields_add, mcp_span, trace_id_of
from audit.writer import audit_writer
from handoff.mcp.caller import Caller
from handoff.mcp.pipeline.call import CONSOLE, Call
from handoff.mcp.pipeline.run import call_serve
from handoff.snapshot import snapshot
from policy.builtin_agents import CONSOLE_AGENT
from policy.config_version import config_version
from policy.models import Agent, team_slug_of


@dataclass(frozen=True)
class ConsoleCall:
    request_id: str
    result: dict[str, Any] | None = None  # what an agent would have read
    refusal: str = ""  # the gateway's refusal, as an agent would have read it
    code: str = ""


def console_agent(*, actor: str) -> tuple[int, int]:
    """The console's agent id, made (and audited) on first use, and a config version that knows it."""
    with transaction.atomic():
        agent, created = Agent.objects.get_or_create(name=CONSOLE_AGENT)
        if created:
            detail = {"action": "agent_created", "reason": "the console's calls"}
            mine = {"agent_id": agent.id, "agent_name": agent.name, "team": team_slug_of(agent)}
            audit_record(kind="admin_change", actor=actor, detail=detail, **mine)
    return agent.id, config_version()


async def console_call(
    *, agent_id: int, version: int, operator: str, name: str, arguments: dict[str, Any]
) -> ConsoleCall:
    """One tools/call of `name` as the console agent, on behalf of `operator`."""
    snap = await snapshot.at_least(version)
    team = snap.agent_teams.get(agent_id, "")
    caller = Caller(agent_id, CONSOLE_AGENT, "console", key_prefix=f"console-{operator}", team=team)
    request_id = uuid.uuid4()
    with mcp_span(
        "tools/call", meta=None, protocol_version=None, request_id=None, session_id="", transport="console", tool=name
    ) as span:
        trace_id = trace_id_of(span)
        log_fields_add(trace_id=trace_id, agent=CONSOLE_AGENT, tool=name, request_id=str(request_id))
        call = Call(name, arguments, trace_id, origin=CONSOLE, caller=caller, request_id=request_id, actor=operator)
        call.snap = snap
        try:
            return await call_serve(call, _console_answer)
        except MCPError as refused:  # an audit row that could not be written
            code = (refused.data or {}).get("code", "") if isinstance(refused.data, dict) else ""
            return ConsoleCall(str(request_id), refusal=refused.message, code=code)


async def _console_answer(call: Call) -> ConsoleCall:
    if call.denial:
        return ConsoleCall(str(call.request_id), refusal=call.denial.message, code=call.denial.code)
    assert call.outcome is not None
    return ConsoleCall(str(call.request_id), result=call.result, code=call.outcome.get("code", ""))


def console_call_from_sync(*, own_loop: bool, **call: Any) -> ConsoleCall:
    """console_call from sync code (the admin's views). Served by Daphne, async_to_sync runs it on the
    server's loop; elsewhere (WSGI, Django's test client) on a loop made for it, whose audit connections
    must not outlive it."""

    async def closing() -> ConsoleCall:
        try:
            return await console_call(**call)
        finally:
            if own_loop:
                await audit_writer.close()

    return async_to_sync(closing)()
