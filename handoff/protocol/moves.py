"""The handoff protocol's two moves: a triage tool hands the session to a specialist through a tunnel of
its own, and `return_to_triage` brings it back with the specialist's summary as untrusted data.

Both run as gateway tools inside the dispatcher's audit (approved, then completed); a refusal is a
`ToolRefused` carrying the code the model sees. Errors of the tunnelled calls in between are the
dispatcher's, like those of any call.
"""

import inspect
import logging
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import anyio
from django.conf import settings

from gateway_project.lib.database import database_async
from gateway_project.lib.signing import canonical_json
from handoff.mcp.audit_rows import record
from handoff.mcp.caller import Caller, legacy_agent
from handoff.mcp.list_changed import change_relay, session_remember, tools_changed_everywhere
from handoff.protocol.claim_checks import claim_store
from handoff.protocol.summary import summary_envelope
from handoff.protocol.tunnels import (
    SessionTunnel,
    TunnelRefused,
    handoff_row,
    index_session,
    session_index,
    tunnel_create,
    tunnel_end,
    tunnel_opened,
)
from handoff.snapshot import RouteSettings, Snapshot, TriageEntry, UpstreamInfo
from handoff.triage import Handoff
from policy.decisions import RETRY_LATER, Denial, ToolRefused, Who
from policy.manifest import manifest_sanitize, schema_problem, tool_name_problem
from registry.executor import get_executor
from registry.naming import exposed_name, gateway_tool_name
from registry.upstreams.outcome import TUNNEL_GONE

logger = logging.getLogger(__name__)
HANDOFF_FAILED = -32004
RETURN_TOOL = "return_to_triage"
INLINE_STATE_BYTES = 2048
MAX_SPECIALIST_TOOLS = 256  # a specialist offers a domain's tools, not a catalog; each session stores them
# What the model is told for each way a handoff fails to open.
OPEN_FAILURES = {
    "UPSTREAM_CONNECT_TIMEOUT": "The specialist did not accept the handoff in time. Try again later.",
    "EXPIRED_DELEGATION_TOKEN": "The specialist refused the delegation as expired or already used. Hand off again.",
    TUNNEL_GONE: "The specialist could not be reached. Try again later or carry on without it.",
}


def refused(
    code: str, message: str, jsonrpc_code: int = HANDOFF_FAILED, retry_after: float | None = None
) -> ToolRefused:
    return ToolRefused(Denial(code, message, jsonrpc_code, retry_after))


def connecting() -> Denial:
    return Denial(
        "HANDOFF_CONNECTING", "The handoff to a specialist is still connecting. Retry in a moment.", RETRY_LATER, 1.0
    )


def return_tool_name() -> str:
    return gateway_tool_name(RETURN_TOOL)


def return_definition() -> dict[str, Any]:
    return {
        "name": return_tool_name(),
        "title": "Return to triage",
        "description": "End the handoff: close the specialist's session, restore the gateway's own tools and "
        "receive the specialist's summary.",
        "inputSchema": {
            "type": "object",
            "properties": {"note": {"type": "string", "description": "Anything the specialist should know"}},
        },
    }


@dataclass(frozen=True)
class Plan:
    target: UpstreamInfo
    route: RouteSettings
    reason: str
    state: Any


def target_resolve(snap: Snapshot, target: str) -> UpstreamInfo:
    """The upstream a handoff target names: a registry key (slug), or an mcp:// or mcps:// URI whose host's
    first label is one. It must be reachable and have a URI to carry the delegation to."""
    key = target
    if "://" in target:
        parts = urlsplit(target)
        if parts.scheme not in ("mcp", "mcps") or not parts.hostname:
            raise refused(
                "REGISTRY_LOOKUP_FAILED", f"The handoff target {target!r} is not a registry key or mcp:// URI."
            )
        key = parts.hostname.split(".")[0]
    found = snap.targets.get(key)
    if found is None or not found.reachable:
        raise refused("REGISTRY_LOOKUP_FAILED", f"No specialist named {key!r} is registered and enabled.")
    if not found.url:
        raise refused(
            "REGISTRY_INVALID_URI",
            f"The specialist {key!r} has no URI to hand a session to (it is not an HTTP server).",
        )
    return found


async def _plan(snap: Snapshot, caller: Caller, triage: TriageEntry, arguments: dict[str, Any]) -> Plan | dict:
    """Where the triage tool sends the session, or its plain answer when it hands nothing off."""
    if triage.route is not None:
        target = target_resolve(snap, triage.target)
        return Plan(target, triage.route, str(arguments.get("reason", "")), arguments.get("context"))
    assert triage.tool is not None
    handler = triage.tool.handler
    if inspect.iscoroutinefunction(handler):
        answer = await handler(arguments, caller.agent_name)
    else:
        answer = await database_async(handler)(arguments, caller.agent_name)  # may read the database
    if not isinstance(answer, Handoff):
        text = answer if isinstance(answer, str) else canonical_json(answer).decode()
        return {"content": [{"type": "text", "text": text}]}
    target = target_resolve(snap, answer.target)
    domain = answer.domain or target.slug
    route = snap.routes.get(target.slug) or RouteSettings(
        None,
        domain,
        settings.GATEWAY_HANDOFF_CONNECT_TIMEOUT,
        settings.GATEWAY_HANDOFF_MAX_SESSIONS,
        settings.GATEWAY_HANDOFF_IDLE_SECONDS,
    )
    return Plan(target, replace(route, domain=domain), answer.reason, answer.carry_over_state)


def traceparent_new() -> str:
    """A W3C trace context for the handoff: version 00, a fresh trace and span, sampled."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


async def grant_build(
    *, token_id: str, domain: str, audience: str, reason: str, state: Any, idle_timeout: float
) -> dict[str, Any]:
    """What the executor opens the tunnel with: the claims (the carried state inline, or past 2 KB parked
    in the claim-check store with only its id inside), a W3C trace context, and the idle timeout."""
    traceparent = traceparent_new()
    claims: dict[str, Any] = {
        "iss": settings.GATEWAY_NAME,
        "sub": domain,
        "aud": audience,
        "tid": token_id,
        "traceparent": traceparent,
        "reason": reason,
    }
    if len(canonical_json({"state": state})) > INLINE_STATE_BYTES:
        claims["state_ref"] = await claim_store().put({"tid": token_id, "state": state})
    else:
        claims["state"] = state
    ttl = settings.GATEWAY_HANDOFF_TOKEN_TTL
    return {"claims": claims, "ttl": ttl, "traceparent": traceparent, "idle_timeout": idle_timeout}


def specialist_tools(
    snap: Snapshot, who: Who, plan: Plan, listed: list[Any]
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The specialist's tools as this agent sees them: sanitised, under the domain, marked with it, filtered
    by the same rules as any tool; the specialist's own `return_to_triage` is the gateway's to call."""
    domain, names, definitions = plan.route.domain, {}, []
    for tool in listed[:MAX_SPECIALIST_TOOLS]:
        name = tool.get("name") if isinstance(tool, dict) else None
        if tool_name_problem(name) or name == RETURN_TOOL or schema_problem(tool):
            continue
        exposed = exposed_name(domain, name)
        if exposed in names:  # listed twice
            continue
        if snap.permits(who, plan.target, exposed, name) is not None:
            continue
        clean = manifest_sanitize(tool)
        names[exposed] = name
        definitions.append(
            clean
            | {
                "name": exposed,
                "title": f"[{domain}] {clean.get('title') or name}",
                "description": f"({domain} specialist) {clean.get('description', '')}".strip(),
            }
        )
    return names, [*definitions, return_definition()]


def _handoff_row(caller: Caller, session: SessionTunnel, event: str, **fields: Any) -> dict[str, Any]:
    return handoff_row(
        event,
        domain=session.domain,
        tunnel_id=session.tunnel_id,
        token_id=session.token_id,
        **caller.audited,
        session_id=caller.session_key,
        transport=caller.transport,
        upstream=session.upstream_slug,
        **fields,
    )


async def handoff_activate(ctx: Any, caller: Caller, snap: Snapshot, triage: TriageEntry, arguments: dict) -> dict:
    plan = await _plan(snap, caller, triage, arguments)
    if isinstance(plan, dict):
        return plan
    await change_relay.ensure_running()  # so that this process hears the change it is about to announce
    key = index_session(caller.agent_id, caller.session_key)
    try:
        tunnel = await database_async(tunnel_create)(
            agent_id=caller.agent_id,
            session_key=caller.session_key,
            domain=plan.route.domain,
            upstream_id=plan.target.id,
            route_id=plan.route.route_id,
            max_sessions=plan.route.max_sessions,
            idle_timeout=plan.route.idle_timeout,
        )
    except TunnelRefused as refusal:
        if refusal.code == "HANDOFF_CONNECTING":
            raise ToolRefused(connecting()) from None
        raise refused(
            "SESSION_LIMIT_EXCEEDED",
            f"The {plan.route.domain} specialist has no room for another session. Try again later.",
            RETRY_LATER,
            30.0,
        ) from None
    session = SessionTunnel(str(tunnel.id), plan.route.domain, plan.target.slug)
    try:
        return await _open(ctx, caller, snap, plan, session, key)
    except BaseException:  # the client left, or anything unforeseen: the session must not stay "connecting"
        with anyio.CancelScope(shield=True):
            if await database_async(tunnel_end)(session.tunnel_id, "abandoned"):
                await get_executor().tunnel_close(tunnel_id=session.tunnel_id, queue=session.queue)
                await session_index().forget(key, session.tunnel_id)
        raise


async def _open(ctx: Any, caller: Caller, snap: Snapshot, plan: Plan, session: SessionTunnel, key: str) -> dict:
    """Open the tunnel and switch the session's tools to the specialist's."""
    await session_index().put(key, session)
    grant = await grant_build(
        token_id=session.token_id,
        domain=session.domain,
        audience=plan.target.slug,
        reason=plan.reason,
        state=plan.state,
        idle_timeout=plan.route.idle_timeout,
    )
    token = {"token_id": session.token_id, "traceparent": grant["traceparent"]}
    started = time.perf_counter()
    outcome = await get_executor().tunnel_open(
        tunnel_id=session.tunnel_id, upstream_id=plan.target.id, grant=grant, connect_timeout=plan.route.connect_timeout
    )
    if outcome["ok"]:
        session.queue = outcome["result"]["queue"]
        if not await database_async(tunnel_opened)(session.tunnel_id, session.queue):
            outcome = {"ok": False, "code": TUNNEL_GONE, "detail": "closed by an operator while connecting"}
    if not outcome["ok"]:
        code = outcome["code"] if outcome["code"] in OPEN_FAILURES else TUNNEL_GONE
        await database_async(tunnel_end)(session.tunnel_id, code)
        await get_executor().tunnel_close(tunnel_id=session.tunnel_id, queue=session.queue)
        await session_index().forget(key, session.tunnel_id)
        detail = outcome.get("detail", "")
        await record(**_handoff_row(caller, session, "failed", error_code=code, error_detail=detail, detail=token))
        raise refused(code, OPEN_FAILURES[code])
    session.state = "open"
    listed = outcome["result"]["tools"]
    session.tools, session.definitions = specialist_tools(snap, caller.who, plan, listed)
    session.summary_tool = any(isinstance(t, dict) and t.get("name") == RETURN_TOOL for t in listed)
    await session_index().put(key, session)
    elapsed = {"connect_ms": round((time.perf_counter() - started) * 1000, 1)}
    await record(**_handoff_row(caller, session, "activated", detail=token | elapsed | {"reason": plan.reason}))
    if legacy_agent(ctx):
        session_remember(key, ctx.session)
    await tools_changed_everywhere([key])
    sep = settings.GATEWAY_TOOL_SEPARATOR
    text = (
        f"Handed off to the {session.domain} specialist. Your tools are now {session.domain}{sep}* "
        f"(call tools/list); call {return_tool_name()} when its work is done."
    )
    return {"content": [{"type": "text", "text": text}]}


async def handoff_return(ctx: Any, caller: Caller, snap: Snapshot, session: SessionTunnel, arguments: dict) -> dict:
    if not session.is_open:
        raise ToolRefused(connecting())
    summary, executor = "", get_executor()
    if session.summary_tool:
        target = snap.targets.get(session.upstream_slug)
        outcome = await executor.tunnel_call(
            tunnel_id=session.tunnel_id,
            queue=session.queue,
            tool=RETURN_TOOL,
            arguments=arguments,
            timeout=target.timeout if target else settings.GATEWAY_DEFAULT_TIMEOUT,
        )
        if outcome["ok"]:
            summary = "\n".join(
                c.get("text", "") for c in outcome["result"].get("content") or [] if c.get("type") == "text"
            )
    await tunnel_gone(caller, session, "returned", summary_chars=len(summary))
    text = f"Back from {session.domain}; your own tools are restored (call tools/list).\n\n"
    return {"content": [{"type": "text", "text": text + summary_envelope(session.domain, summary)}]}


async def tunnel_gone(caller: Caller, session: SessionTunnel, reason: str, **detail: Any) -> None:
    """Close the session's tunnel from inside the session (returned, or its upstream lost) and tell the agent."""
    key = index_session(caller.agent_id, caller.session_key)
    if await database_async(tunnel_end)(session.tunnel_id, reason):
        error = reason if reason == TUNNEL_GONE else ""
        await record(**_handoff_row(caller, session, reason.lower(), error_code=error, detail=detail))
    await get_executor().tunnel_close(tunnel_id=session.tunnel_id, queue=session.queue)
    await session_index().forget(key, session.tunnel_id)
    await tools_changed_everywhere([key])


async def end_handoff(caller: Caller) -> None:
    """The agent's session is over (its socket closed, or it sent DELETE): so is its handoff. Never raises:
    a session ends whatever state the gateway's stores are in (the sweep catches what this misses)."""
    try:
        session = await session_index().get(index_session(caller.agent_id, caller.session_key))
        if session is not None:
            await tunnel_gone(caller, session, "session ended")
    except Exception:
        logger.exception("closing the handoff of an ended session failed")
