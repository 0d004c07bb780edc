"""A call's audit rows: denied, or approved and then completed (exactly once, whatever happens in between).
Their fields are made from the request object when the row is written, never kept in a dict the stages mutate."""

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Coroutine
from typing import Any

import anyio
from django.conf import settings
from django.db import Error as DatabaseError
from mcp.shared.exceptions import MCPError

from audit.outcomes import DEADLINE, call_deadline
from audit.services import canonical_sha256
from audit.telemetry import DENIALS, call_observe, span_failed
from gateway_project.lib.database import database_async
from handoff.mcp.audit_rows import record
from handoff.mcp.caller import Caller
from handoff.mcp.pipeline.call import AGENT, EXECUTE, Call
from handoff.mcp.pipeline.results import error_text
from handoff.protocol.tunnels import tunnel_touch
from policy.decisions import Denial
from policy.limits.admission import health_of
from policy.limits.stores import limit_store

# Kept from before the pipeline: operators' log filters name it.
logger = logging.getLogger("handoff.mcp.tools")

CANCELLED_DETAIL = "cancelled before the upstream answered"  # a cancelled call's completion row
# What a gateway tool's deadline is reckoned from: the longest it waits, for an execution or a specialist.
GATEWAY_TOOL_TIMEOUT = max(settings.GATEWAY_SANDBOX_TIMEOUT, settings.GATEWAY_HANDOFF_CONNECT_TIMEOUT)


def request_audit(
    caller: Caller,
    name: str,
    request_id: uuid.UUID,
    arguments_sha256: str,
    upstream: str,
    tool: str,
    trace_id: str,
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "trace_id": trace_id,
        **caller.audited,
        "session_id": caller.session_id,
        "transport": caller.transport,
        "exposed_name": name,
        "arguments_sha256": arguments_sha256,
        "upstream": upstream,
        "tool": tool,
    }


def call_audit(call: Call) -> dict[str, Any]:
    """The fields every row of this call holds, as the stages so far found them."""
    assert call.caller is not None
    audit = request_audit(
        call.caller,
        call.name,
        call.request_id,
        # Made once at approval; a denial's row, before it, hashes the arguments as they stand.
        call.arguments_sha256 or canonical_sha256(call.arguments),
        call.upstream,
        call.tool,
        call.trace_id,
    )
    if call.actor:
        audit["actor"] = call.actor
    if detail := _detail(call):
        audit["detail"] = detail
    return audit


def _detail(call: Call) -> dict[str, Any]:
    if call.own:
        return code_detail(call.arguments) if call.own == EXECUTE and not call.denial else {}
    detail: dict[str, Any] = {}
    if call.tunnel is not None:
        detail = {"domain": call.tunnel.domain, "tunnel_id": call.tunnel.tunnel_id, "token_id": call.tunnel.token_id}
    if call.execution:
        detail["execution"] = call.execution
    if call.credential and call.approved:  # named by id and kind, never by value
        detail["credential"] = call.credential.named()
    if call.signed_off:
        detail["sign_off"] = call.signed_off
    elif call.denial and call.denial.sign_off:  # the request it waits for, or that refused it
        detail["sign_off"] = call.denial.sign_off
    if call.extra_stage:
        detail["stage"] = call.extra_stage
    if call.stage_audit:
        detail["stages"] = call.stage_audit
    return detail


def code_detail(arguments: dict[str, Any]) -> dict[str, Any]:
    """What an execution's rows say of its code: its hash always (its text only with audit payloads on)."""
    code = arguments.get("code")
    if not isinstance(code, str):
        return {}
    return {"code_sha256": hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()}


def with_payload(audit: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    """The fields of a decision row, holding the arguments themselves where the operator keeps payloads."""
    if not settings.GATEWAY_AUDIT_PAYLOADS:
        return audit
    return audit | {"detail": audit.get("detail", {}) | {"arguments": arguments}}


def approval(audit: dict[str, Any], arguments: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The approval row's fields, with how long the call may take (an upstream's `timeout`, as the executor
    waits for it): past that and a grace period with no completion, the sweep settles it (audit/outcomes.py)."""
    fields = with_payload(audit, arguments)
    return fields | {"detail": fields.get("detail", {}) | {DEADLINE: call_deadline(timeout)}}


async def denial_record(denial: Denial, audit: dict[str, Any], arguments: dict[str, Any]) -> None:
    """The denied row; a policy refusal's names the rule (id and note) or the stance it rests on."""
    DENIALS.labels(denial.code).inc()
    fields = with_payload(audit, arguments)
    if denial.grounds:
        fields = fields | {"detail": fields.get("detail", {}) | {"policy": denial.grounds.detail()}}
    await record(kind="denied", outcome="denied", error_code=denial.code, error_detail=denial.message, **fields)


def denial_error(denial: Denial, request_id: uuid.UUID) -> MCPError:
    """The JSON-RPC error an agent gets for a refusal."""
    return MCPError(denial.jsonrpc_code, denial.message, denial.data() | {"requestId": str(request_id)})


async def denial_row(call: Call) -> None:
    assert call.denial is not None
    await denial_record(call.denial, call_audit(call), call.arguments)
    call_logged(call, "denied", call.denial.code)


async def approval_row(call: Call) -> None:
    """Written before the upstream is touched; if it cannot be, the admission goes back."""
    call.approved = True
    # Final from here on (an override mapped them in decide): the completion row holds the same digest.
    call.arguments_sha256 = canonical_sha256(call.arguments)
    timeout = GATEWAY_TOOL_TIMEOUT if call.own or call.route is None else call.route.timeout
    try:
        await record(kind="approved", **approval(call_audit(call), call.arguments, timeout))
    except BaseException:
        await admission_release(call, "none")
        raise


async def cancelled_row(call: Call, duration_ms: float) -> None:
    """A call cancelled while it ran (the client left) gets its completion row."""
    with anyio.CancelScope(shield=True):
        await record(
            kind="completed",
            outcome="error",
            error_code="CANCELLED",
            error_detail=CANCELLED_DETAIL,
            duration_ms=duration_ms,
            **call_audit(call),
        )


async def refused_row(call: Call, denial: Denial) -> None:
    """A gateway tool that refused its call once approved (a handoff move, code mode's arguments)."""
    await record(
        kind="completed",
        outcome="error",
        error_code=denial.code,
        error_detail=denial.message,
        duration_ms=call.duration_ms,
        **call_audit(call),
    )
    call_logged(call, "error", denial.code)


async def completion_row(call: Call) -> None:
    """The completion row, the admission's release and a tunnel's use, at once and shielded from a client that
    leaves now."""
    outcome, result = call.outcome, call.result
    assert outcome is not None and result is not None
    # The gateway's own tools: their outcome alone says how they went, and no upstream's health is read from it.
    failed = not outcome["ok"] or (not call.own and bool(result.get("isError")))
    status = ("timeout" if outcome.get("code") == "UPSTREAM_TIMEOUT" else "error") if failed else "ok"
    if not call.own:
        call_observe(upstream=call.upstream, outcome=status, duration_ms=call.duration_ms)
    if failed:
        span_failed(outcome.get("code", "tool_error"), error_text(result), call.span)
    code = outcome.get("code", "" if call.own else "TOOL_ERROR" if failed else "")
    detail = outcome.get("detail") or (error_text(outcome["result"]) if failed and not call.own else "")
    completion = record(
        kind="completed",
        duration_ms=call.duration_ms,
        response_bytes=len(json.dumps(result)),
        outcome=status,
        error_code=code,
        error_detail=detail,
        **call_audit(call),
    )
    beside = [_touch(call.tunnel.tunnel_id)] if call.tunnel is not None and not call.own else []
    if (release := _release(call, "none" if call.own else health_of(outcome.get("code")))) is not None:
        beside.append(release)
    with anyio.CancelScope(shield=True):
        await _meanwhile(completion, beside)
    call_logged(call, status, code)


async def _meanwhile(first: Awaitable[None], others: list[Coroutine[Any, Any, None]]) -> None:
    """`first` in this task and the others meanwhile, a task each, every one awaited: gather's work with a task
    fewer (each costs about 7 µs of CPU, and every admitted call has one other)."""
    tasks = [asyncio.ensure_future(other) for other in others]
    try:
        await first
    finally:
        for task in tasks:
            await task


async def admission_release(call: Call, health: str) -> None:
    if (release := _release(call, health)) is not None:
        with anyio.CancelScope(shield=True):
            await release


def _release(call: Call, health: str) -> Coroutine[Any, Any, None] | None:
    """The release of the call's admission, taken from the call so that it goes back once, or None if it has."""
    if call.admission is None:
        return None
    admission, call.admission = call.admission, None
    return limit_store().release(admission, health, call.probing)


async def _touch(tunnel_id: str) -> None:
    """Note the tunnel's use. Only its idle time depends on it: a database that cannot take it now costs
    the call nothing."""
    try:
        await database_async(tunnel_touch)(tunnel_id)
    except DatabaseError:
        logger.exception("tunnel %s: its last use could not be noted", tunnel_id)


def call_logged(call: Call, outcome: str, code: str) -> None:
    """One line for an agent's tools/call, with the outcome and code its audit row holds, as fields of their own
    (the JSON format writes them) and in the message (for the text one)."""
    if call.origin != AGENT:
        return
    duration_ms = call.duration_ms if call.approved else call.elapsed_ms()  # a run call's: as its row says
    fields = {"outcome": outcome, "code": code, "duration_ms": round(duration_ms, 3)}
    logger.info("tools/call %s: %s in %.0f ms", call.name, f"{outcome} {code}".strip(), duration_ms, extra=fields)
