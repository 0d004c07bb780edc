"""Audit rows from the MCP layer: written before anything they describe goes on, or the request fails."""

import logging
from typing import Any

from mcp.shared.exceptions import MCPError

from audit.models import AuditEvent
from audit.outcomes import OUTCOME_UNKNOWN
from audit.telemetry import AUDIT_FAILURES, SESSIONS
from audit.writer import AuditSettled, AuditUnavailable, audit_writer
from handoff.mcp.caller import Caller, Refused

logger = logging.getLogger(__name__)
AUDIT_UNAVAILABLE = -32002


async def record(*, kind: str, **fields: Any) -> None:
    """Write the row or refuse to go on: a call never runs, nor is its result shown, unrecorded."""
    try:
        await audit_writer.record(kind=kind, **fields)
    except AuditSettled as exc:  # the sweep wrote this call's outcome first (audit/outcomes.py)
        logger.warning("request %s completed after its deadline: its result is withheld", fields.get("request_id"))
        message = (
            "This call outlived its deadline, so the gateway recorded its outcome as unknown and withholds its "
            "result. It may have taken effect: check before repeating it."
        )
        data = {"code": OUTCOME_UNKNOWN, "requestId": str(fields.get("request_id"))}
        raise MCPError(AUDIT_UNAVAILABLE, message, data) from exc
    except AuditUnavailable as exc:
        logger.error("audit write failed (%s row, request %s): %s", kind, fields.get("request_id"), exc)
        AUDIT_FAILURES.labels(kind).inc()
        ran = "ran, but its result is withheld" if kind == "completed" else "was not run"
        message = f"The gateway could not record this call, so it {ran}. Try again shortly."
        raise MCPError(AUDIT_UNAVAILABLE, message, {"code": "AUDIT_UNAVAILABLE"}) from exc


def _who(caller: Caller) -> dict[str, Any]:
    """The row's fields that say who: the agent and its team, the person and client, the session and transport."""
    return caller.audited | {"session_id": caller.session_id, "transport": caller.transport}


async def session_record(caller: Caller, action: str, **detail: Any) -> None:
    """A stateful session opened or closed. Unlike a call's rows, a lost one refuses nothing: no tool runs
    because of it, and a session must close whatever the database says."""
    if caller.transport == "ws":  # HTTP sessions are counted from their store (streamable_http/legacy.py)
        SESSIONS.labels("ws").inc(1 if action == "opened" else -1)
    try:
        await audit_writer.record(
            kind=AuditEvent.Kind.SESSION,
            **_who(caller),
            detail={"action": f"session_{action}", "key_prefix": caller.key_prefix} | detail,
        )
    except AuditUnavailable as exc:
        logger.error("audit write failed (session %s %s): %s", caller.session_id, action, exc)


async def refusal_record(transport: str, refused: Refused) -> None:
    """A bearer token refused at the door: who tried is unknown, so the row holds what was wrong with it (a caller
    a virtual server refused is known, and named). A request with no credentials or a wrong API key gets none: that
    is the Internet knocking."""
    if not refused.code:
        return
    try:
        await audit_writer.record(
            **(refused.caller.audited if refused.caller else {}),
            kind=AuditEvent.Kind.DENIED,
            transport=transport,
            outcome=AuditEvent.Outcome.DENIED,
            error_code=refused.code,
            error_detail=refused.message,
        )
    except AuditUnavailable as exc:
        logger.error("audit write failed (refused credentials, %s): %s", refused.code, exc)


async def unserved_record(caller: Caller, error_code: str, message: str, **detail: Any) -> None:
    """A request the gateway could not serve for want of its own state (Redis down): refused, and said here."""
    try:
        await audit_writer.record(
            kind=AuditEvent.Kind.DENIED,
            **_who(caller),
            outcome=AuditEvent.Outcome.DENIED,
            error_code=error_code,
            error_detail=message,
            detail=detail,
        )
    except AuditUnavailable as exc:
        logger.error("audit write failed (unserved request, %s): %s", error_code, exc)
