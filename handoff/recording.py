"""Audit rows from the MCP layer: written before anything they describe goes on, or the request fails."""

import logging
from typing import Any

from mcp.shared.exceptions import MCPError

from audit.writer import AuditUnavailable, audit_writer

logger = logging.getLogger(__name__)
AUDIT_UNAVAILABLE = -32002


async def record(*, kind: str, **fields: Any) -> None:
    """Write the row or refuse to go on: a call never runs, nor is its result shown, unrecorded."""
    try:
        await audit_writer.record(kind=kind, **fields)
    except AuditUnavailable as exc:
        logger.error("audit write failed (%s row, request %s): %s", kind, fields.get("request_id"), exc)
        ran = "ran, but its result is withheld" if kind == "completed" else "was not run"
        message = f"The gateway could not record this call, so it {ran}. Try again shortly."
        raise MCPError(AUDIT_UNAVAILABLE, message, {"code": "AUDIT_UNAVAILABLE"}) from exc
