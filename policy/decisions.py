"""The call decision: a pure function of what is known about the caller and the target."""

from dataclasses import dataclass

from mcp import types

# JSON-RPC codes: unknown tools are invalid params (the spec's choice); refusals sit in the server range.
INVALID_PARAMS = types.INVALID_PARAMS
POLICY_DENIED = -32001


@dataclass(frozen=True)
class Denial:
    code: str
    message: str
    jsonrpc_code: int = POLICY_DENIED


@dataclass(frozen=True)
class Target:
    """What the router found for an exposed tool name (None fields: nothing found)."""

    exposed_name: str
    upstream_slug: str | None
    upstream_enabled: bool
    tool_known: bool


def policy_decide(*, agent_enabled: bool, target: Target) -> Denial | None:
    """None when the call may go ahead, else the reason it may not, written for the model."""
    if not agent_enabled:
        return Denial("AGENT_DISABLED", "This agent has been disabled by an administrator.")
    if target.upstream_slug is None or not target.tool_known:
        return Denial(
            "TOOL_NOT_FOUND",
            f"Unknown tool: {target.exposed_name!r}. Call tools/list for the tools this gateway offers.",
            INVALID_PARAMS,
        )
    if not target.upstream_enabled:
        return Denial(
            "UPSTREAM_DISABLED",
            f"The tool {target.exposed_name!r} belongs to the service {target.upstream_slug!r}, "
            "which an administrator has disabled. Do not retry; choose another tool.",
        )
    return None
