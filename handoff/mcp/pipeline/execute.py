"""The execute stage and what follows it before the completion row: the executor runs an upstream's tool
(inline, the worker, or a handoff's tunnel), or the gateway runs one of its own; then the outcome is shaped
for the model (errors redacted, an input-required round passed through)."""

import logging
import time
from collections.abc import Awaitable
from typing import Any

import anyio
from django.db import Error as DatabaseError

from audit.telemetry import current_traceparent
from handoff.mcp.caller import legacy_agent
from handoff.mcp.input_required import UndeclaredAsk, passed_through
from handoff.mcp.pipeline.call import ACTIVATE, AGENT, RETURN, Call
from handoff.mcp.pipeline.extra import after_execute_stages
from handoff.mcp.pipeline.results import error_result, for_model
from handoff.mcp.pipeline.rows import cancelled_row
from handoff.protocol.moves import handoff_activate, handoff_return
from handoff.protocol.tunnels import SessionTunnel
from handoff.snapshot_tools import Route
from registry.executor import get_executor
from registry.personal import CredentialRef
from registry.upstreams.outcome import Outcome, failure
from registry.upstreams.relay import Relay
from registry.upstreams.requests import UpstreamRequest

logger = logging.getLogger(__name__)

AFTER_EXECUTE_FAILED = (
    "The gateway failed after the service answered: this call ran, but its result is withheld. "
    "Check before repeating it."
)


async def execute_stage(call: Call) -> None:
    """The outcome and its duration; a call cancelled meanwhile (the client left) gets its completion row.
    A gateway tool's refusal (ToolRefused) goes up to the runner."""
    started = time.perf_counter()
    try:
        call.outcome = await _run(call)
    except anyio.get_cancelled_exc_class():
        await cancelled_row(call, (time.perf_counter() - started) * 1000)
        raise
    finally:
        call.duration_ms = (time.perf_counter() - started) * 1000


def _run(call: Call) -> Awaitable[Outcome]:
    assert call.caller is not None and call.snap is not None
    if call.own == ACTIVATE:
        assert call.triage is not None
        return completed(handoff_activate(call.ctx, call.caller, call.snap, call.triage, call.arguments))
    if call.own == RETURN:
        assert call.tunnel is not None
        return completed(handoff_return(call.ctx, call.caller, call.snap, call.tunnel, call.arguments))
    if call.own:
        return call.own_tools[call.own](call)
    assert call.route is not None
    legacy = call.origin == AGENT and call.ctx is not None and legacy_agent(call.ctx)
    return route_execute(call.route, call.arguments, call.tunnel, call.relay, call.rounds, call.credential, legacy)


async def completed(move: Awaitable[dict[str, Any]]) -> Outcome:
    """A gateway tool's outcome; one whose state the database could not take is a failure the model reads (and
    the audit records), not an internal error."""
    try:
        return {"ok": True, "result": await move}
    except DatabaseError as exc:
        logger.exception("gateway tool failed on the database")
        message = "The gateway could not reach its database just now, so this may not have taken effect. Retry shortly."
        return failure("STATE_UNAVAILABLE", message, repr(exc))


async def route_execute(
    route: Route,
    arguments: dict[str, Any],
    tunnel: SessionTunnel | None = None,
    relay: Relay | None = None,
    rounds: dict[str, Any] | None = None,
    credential: CredentialRef | None = None,
    legacy: bool = False,
) -> Outcome:
    """The executor's outcome; if it fails in a way it did not foresee, an outcome all the same, so that
    every approved call gets its completion row."""
    executor = get_executor()
    try:
        if tunnel is not None:
            return await executor.tunnel_call(
                tunnel_id=tunnel.tunnel_id,
                queue=tunnel.queue,
                tool=route.tool,
                arguments=arguments,
                timeout=route.timeout,
            )
        request = UpstreamRequest.tool_call(
            route.upstream_id,
            route.revision,
            route.tool,
            arguments,
            timeout=route.timeout,
            traceparent=current_traceparent(),
            rounds=rounds,
            person=credential.wire() if credential else None,
            legacy=legacy,
        )
        return await executor.request(request, relay)
    except Exception as exc:
        logger.exception("executor failed on %s/%s", route.upstream_slug, route.tool)
        return failure(
            "GATEWAY_ERROR", "The gateway failed while running this call; it may or may not have run.", repr(exc)
        )


async def result_stage(call: Call) -> None:
    """The result the model will read. A step here that fails leaves the call's outcome a GATEWAY_ERROR: the
    call ran, so it gets its completion row all the same, and the agent an error rather than the result."""
    assert call.outcome is not None
    try:
        call.result = for_model(call.name, call.outcome)
        if call.override is not None:
            call.result = call.override.result(call.result)
        if call.origin == AGENT and not call.own and call.result.get("resultType") == "input_required":
            assert call.caller is not None and call.relay is not None
            try:
                call.result = passed_through(
                    call.caller, call.name, call.upstream, call.result, call.relay.capabilities
                )
            except UndeclaredAsk as undeclared:  # the model reads why the call ended
                call.result = error_result(undeclared.error.message)
        if call.result.get("resultType") != "input_required":
            await after_execute_stages(call)
    except Exception as exc:
        logger.exception("request %s: failed after the upstream answered", call.request_id)
        call.after_failed = True
        call.outcome = failure("GATEWAY_ERROR", AFTER_EXECUTE_FAILED, repr(exc))
        call.result = error_result(AFTER_EXECUTE_FAILED)
