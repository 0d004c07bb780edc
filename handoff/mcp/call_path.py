"""One tool call's path after routing, shared by calls from agents (tools.py) and calls from code
(handoff/codemode/run.py): decide and admit, record the approval, run, record the completion and give the admission
back. Every approved call gets exactly one completion row, whatever happens in between."""

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import anyio
from django.conf import settings
from mcp.shared.exceptions import MCPError

from audit.outcomes import DEADLINE, call_deadline
from audit.services import canonical_sha256
from audit.telemetry import DENIALS, call_observe, current_traceparent, span_failed
from handoff.mcp.audit_rows import record
from handoff.mcp.caller import Caller
from handoff.mcp.personal_access import credential_for
from handoff.protocol.tunnels import SessionTunnel, index_session
from handoff.snapshot import Route, Snapshot
from policy.decisions import Denial
from policy.identity import person_digest
from policy.limits.admission import Admission, health_of, limits_denial
from policy.limits.stores import limit_store
from policy.redaction import redact, redact_error_result
from registry.executor import get_executor
from registry.personal import CredentialRef
from registry.upstreams.outcome import Outcome, failure
from registry.upstreams.relay import Relay
from registry.upstreams.requests import UpstreamRequest

logger = logging.getLogger(__name__)

CANCELLED_DETAIL = "cancelled before the upstream answered"  # a cancelled call's completion row


@dataclass(frozen=True)
class Decision:
    upstream: str  # the upstream the name points at, for the audit
    route: Route | None = None
    denial: Denial | None = None
    admission: Admission | None = None  # held while the call runs; given back by release
    probing: bool = False  # this call is the half-open circuit's one probe
    tunnel: SessionTunnel | None = None  # the handoff tunnel the call goes through
    credential: CredentialRef | None = None  # a per-person upstream's: whose credential the call uses


async def admit(snap: Snapshot, caller: Caller, name: str, route: Route, request_id: str, **found: Any) -> Decision:
    """Admission against shared state (isolation, breaker, limits), which takes the call's share of every
    limit when it admits it."""
    session = index_session(caller.agent_id, caller.session_key)
    agent = snap.agents[caller.agent_id]
    person = person_digest(caller.person_issuer, caller.person_subject) if caller.person_subject else ""
    admission = Admission(
        request_id, session, caller.agent_id, agent, route.limits, stateless=not caller.session_id, person=person
    )
    verdict = await limit_store().admit(admission)
    if verdict.code:
        return Decision(route.upstream_slug, route, limits_denial(admission, verdict, name), **found)
    return Decision(route.upstream_slug, route, admission=admission, probing=verdict.probing, **found)


def key_denial(caller: Caller, name: str) -> Denial | None:
    """A key limited to some tools refuses the rest before anything else looks at the call."""
    if caller.may_call(name):
        return None
    allowed = " ".join(caller.key_tools)
    return Denial("KEY_SCOPE", f"This API key may call only {allowed}: {name!r} is not among them.")


async def decide(snap: Snapshot, caller: Caller, name: str, request_id: str) -> Decision:
    """The static decision over the snapshot, then admission."""
    if denial := key_denial(caller, name):
        return Decision("", None, denial)
    denial, entry, upstream = snap.decide(caller.who, name)
    if denial or entry is None:
        return Decision(upstream, entry.route if entry else None, denial)
    if not entry.route.per_person:
        return await admit(snap, caller, name, entry.route, request_id)
    credential = await credential_for(caller, entry.route, name)
    if isinstance(credential, Denial):
        return Decision(upstream, entry.route, credential)
    return await admit(snap, caller, name, entry.route, request_id, credential=credential)


def request_audit(
    caller: Caller,
    name: str,
    request_id: uuid.UUID,
    arguments: dict[str, Any],
    upstream: str,
    tool: str,
    trace_id: str,
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "trace_id": trace_id,
        "agent_id": caller.agent_id,
        "agent_name": caller.agent_name,
        **caller.person,
        "session_id": caller.session_id,
        "transport": caller.transport,
        "exposed_name": name,
        "arguments_sha256": canonical_sha256(arguments),
        "upstream": upstream,
        "tool": tool,
    }


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


def for_model(name: str, outcome: Outcome) -> dict[str, Any]:
    """What the model sees: results as the upstream sent them, errors redacted (the audit has them whole)."""
    if outcome["ok"]:
        result = outcome["result"]
        return redact_error_result(result) if result.get("isError") else result
    message = outcome["message"] if outcome.get("validation") else redact(outcome["message"])
    return error_result(f"{name}: {message}")


def error_result(text: str) -> dict[str, Any]:
    """A tool's error result the model reads."""
    return {"content": [{"type": "text", "text": text}], "isError": True}


def error_text(result: dict[str, Any]) -> str:
    return "\n".join(item.get("text", "") for item in result.get("content") or [] if item.get("type") == "text")


async def route_execute(
    route: Route,
    arguments: dict[str, Any],
    tunnel: SessionTunnel | None = None,
    relay: Relay | None = None,
    rounds: dict[str, Any] | None = None,
    credential: CredentialRef | None = None,
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
        )
        return await executor.request(request, relay)
    except Exception as exc:
        logger.exception("executor failed on %s/%s", route.upstream_slug, route.tool)
        return failure(
            "GATEWAY_ERROR", "The gateway failed while running this call; it may or may not have run.", repr(exc)
        )


async def denial_record(denial: Denial, audit: dict[str, Any], arguments: dict[str, Any]) -> None:
    """The denied row; a policy refusal's names the rule (id and note) or the stance it rests on."""
    DENIALS.labels(denial.code).inc()
    fields = with_payload(audit, arguments)
    if denial.grounds:
        fields = fields | {"detail": fields.get("detail", {}) | {"policy": denial.grounds.detail()}}
    await record(kind="denied", outcome="denied", error_code=denial.code, error_detail=denial.message, **fields)


def denial_error(denial: Denial, audit: dict[str, Any]) -> MCPError:
    """The JSON-RPC error an agent gets for a refusal."""
    return MCPError(denial.jsonrpc_code, denial.message, denial.data() | {"requestId": str(audit["request_id"])})


async def deny(
    denial: Denial, audit: dict[str, Any], arguments: dict[str, Any], error: MCPError | None = None
) -> NoReturn:
    """Record the refusal, then raise it as the JSON-RPC error the agent gets (or as `error`)."""
    await denial_record(denial, audit, arguments)
    raise error or denial_error(denial, audit)


async def timed(run: Callable[[], Awaitable[Outcome]], audit: dict[str, Any]) -> tuple[Outcome, float]:
    """The outcome and its duration; a call cancelled meanwhile (the client left) gets its completion row."""
    started = time.perf_counter()
    try:
        outcome = await run()
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True):
            duration_ms = (time.perf_counter() - started) * 1000
            await record(
                kind="completed",
                outcome="error",
                error_code="CANCELLED",
                error_detail=CANCELLED_DETAIL,
                duration_ms=duration_ms,
                **audit,
            )
        raise
    return outcome, (time.perf_counter() - started) * 1000


async def run_admitted(
    decision: Decision, audit: dict[str, Any], arguments: dict[str, Any], run: Callable[[], Awaitable[Outcome]]
) -> tuple[Outcome, float]:
    """Record the approval, then run. If the approval cannot be written or the client leaves, the
    admission goes back all the same."""
    assert decision.admission is not None and decision.route is not None
    if decision.credential:  # named by id and kind, never by value; the completion row names it too
        audit["detail"] = audit.get("detail", {}) | {"credential": decision.credential.named()}
    try:
        await record(kind="approved", **approval(audit, arguments, decision.route.timeout))  # before the upstream
        return await timed(run, audit)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await limit_store().release(decision.admission, "none", decision.probing)
        raise


async def conclude(
    decision: Decision,
    audit: dict[str, Any],
    outcome: Outcome,
    result: dict[str, Any],
    duration_ms: float,
    *more: Awaitable[Any],
) -> tuple[str, str]:
    """The completion row and the admission's release (and `more` writes), at once and shielded from a
    client that leaves now; the outcome and code it recorded."""
    assert decision.admission is not None
    failed = not outcome["ok"] or bool(result.get("isError"))
    status = ("timeout" if outcome.get("code") == "UPSTREAM_TIMEOUT" else "error") if failed else "ok"
    call_observe(upstream=decision.upstream, outcome=status, duration_ms=duration_ms)
    if failed:
        span_failed(outcome.get("code", "tool_error"), error_text(result))
    code = outcome.get("code", "TOOL_ERROR" if failed else "")
    completion = record(
        kind="completed",
        duration_ms=duration_ms,
        response_bytes=len(json.dumps(result)),
        outcome=status,
        error_code=code,
        error_detail=outcome.get("detail") or (error_text(outcome["result"]) if failed else ""),
        **audit,
    )
    release = limit_store().release(decision.admission, health_of(outcome.get("code")), decision.probing)
    with anyio.CancelScope(shield=True):
        await asyncio.gather(completion, release, *more)
    return status, code
