"""The stages before anything runs: who is calling and in which session state (caller), where the name leads
(route), whether policy lets it (decide) and whether shared limits admit it now (admit). A stage that refuses
sets `call.denial`; the runner then writes the denied row and answers."""

import logging
from typing import Any

from django.conf import settings

from handoff.mcp.caller import Caller, allows
from handoff.mcp.personal_access import credential_for
from handoff.mcp.pipeline.call import ACTIVATE, AGENT, RETURN, Call
from handoff.protocol.moves import connecting, return_tool_name
from handoff.protocol.tunnels import SessionStateUnavailable, index_session, session_index
from handoff.session_limit import STATE_UNAVAILABLE
from handoff.snapshot import Snapshot, snapshot
from handoff.snapshot_tools import Route
from policy.decisions import INVALID_PARAMS, RETRY_LATER, Denial
from policy.identity import person_digest
from policy.limits.admission import LIMITS_UNAVAILABLE, STATE_CHANGED, Admission, Expected, limits_denial
from policy.limits.stores import limit_store
from registry.overrides import ArgumentsRefused, Override

logger = logging.getLogger(__name__)


def state_unavailable(name: str) -> Denial:
    return Denial(
        STATE_UNAVAILABLE,
        f"The gateway cannot read this session's state right now, so {name!r} was not run. Retry after 1 second.",
        RETRY_LATER,
        1.0,
    )


def key_denial(caller: Caller, name: str, listed: str, handed_off: bool = False) -> Denial | None:
    """A key limited to some tools, or a virtual server offering some, refuses the rest before anything else
    looks at the call; both match the name /mcp lists the tool under (`listed`: a virtual server's override renames
    what it offers, not which). During a handoff the specialist's tools are the session's (the virtual server
    offered the triage tool that handed it over): only the key's limits apply."""
    offered = None if handed_off else caller.offered
    if allows(caller.key_tools, offered, listed):
        return None
    if offered is not None and not allows((), offered, listed):
        message = f"The virtual server {caller.server!r} does not offer {name!r}: call tools/list to see what it does."
        return Denial("NOT_OFFERED", message)
    allowed = " ".join(caller.key_tools)
    return Denial("KEY_SCOPE", f"This API key may call only {allowed}: {name!r} is not among them.")


async def caller_stage(call: Call) -> None:
    """The session's state (an agent's session may be handed off), then the key's own scope."""
    assert call.caller is not None
    call.snap = call.snap or await snapshot.get()
    if call.origin == AGENT:
        try:
            call.tunnel = await session_index().get(index_session(call.caller.agent_id, call.caller.session_key))
        except SessionStateUnavailable:
            logger.exception("session state unavailable")
            call.denial = state_unavailable(call.name)
            return
    handed_off = call.tunnel is not None and call.tunnel.is_open
    listed = call.name if handed_off else call.snap.listed_name(call.caller.who, call.name)
    call.denial = key_denial(call.caller, call.name, listed, handed_off=handed_off)


async def route_stage(call: Call) -> None:
    """Where the name leads. During a handoff only the specialist's tools exist (and the way back): anything
    else is refused, never routed elsewhere. Else a triage tool, code mode's, or an upstream's tool."""
    snap, name = call.snap, call.name
    assert snap is not None
    if call.tunnel is not None:
        if name == return_tool_name():
            call.own, call.upstream = RETURN, settings.GATEWAY_NAME
        else:
            _route_tunnelled(call, snap)
    elif call.origin == AGENT and (triage := snap.triage.get(name)):
        call.own, call.triage, call.upstream = ACTIVATE, triage, settings.GATEWAY_NAME
    elif (builtin := snap.builtins.get(name)) and builtin.policy_target.tool in call.own_tools:
        call.own, call.upstream = builtin.policy_target.tool, settings.GATEWAY_NAME
    elif entry := (snap.tool(call.caller.who, name) if call.caller else snap.tools.get(name)):
        call.route, call.upstream = entry.route, entry.route.upstream_slug


def _route_tunnelled(call: Call, snap: Snapshot) -> None:
    tunnel, name = call.tunnel, call.name
    assert tunnel is not None
    call.upstream = tunnel.upstream_slug
    if not tunnel.is_open:
        call.denial = connecting()
        return
    sep = settings.GATEWAY_TOOL_SEPARATOR
    tool, target = tunnel.tools.get(name), snap.targets.get(tunnel.upstream_slug)
    if tool is None or target is None:
        if name.startswith(f"{tunnel.domain}{sep}"):
            message = f"Unknown tool: {name!r}. Call tools/list for the {tunnel.domain} specialist's tools."
            call.denial = Denial("TOOL_NOT_FOUND", message, INVALID_PARAMS)
            return
        message = (
            f"This session is handed off to {tunnel.domain!r}: only its tools ({tunnel.domain}{sep}*) and "
            f"{return_tool_name()} can be called now. Call {return_tool_name()} first to use {name!r}."
        )
        call.denial = Denial("HANDOFF_NAMESPACE_MISMATCH", message, INVALID_PARAMS)
        return
    call.route = Route(target.id, target.slug, target.revision, target.timeout, tool, target.limits)


async def decide_stage(call: Call) -> None:
    """The static decision over the snapshot (rules, groups, pins); for a per-person upstream, whose credential."""
    snap, caller = call.snap, call.caller
    assert snap is not None and caller is not None
    if call.own == RETURN:
        return
    if call.own:
        call.denial = snap.gateway_denial(caller.who, call.name)
        if not call.denial and call.own != ACTIVATE:
            call.route = snap.builtins[call.name].route
        return
    if call.tunnel is not None:
        target = snap.targets[call.tunnel.upstream_slug]
        assert call.route is not None
        explained = snap.permitted(caller.who, target, call.name, call.route.tool)
        call.denial, call.sign_off = explained.denial, explained.grounds and explained.grounds.sign_off
        return
    call.denial, entry, call.upstream = snap.decide(caller.who, call.name)
    if call.denial or entry is None:
        return
    call.sign_off, call.definition_sha256 = snap.sign_off(caller.who, entry), entry.sha256
    if entry.override is not None:
        overridden(call, entry.override, entry.definition.get("inputSchema") or {})
        if call.denial:
            return
    if not entry.route.per_person:
        return
    credential = await credential_for(caller, entry.route, call.name)
    if isinstance(credential, Denial):
        call.denial = credential
    else:
        call.credential = credential


def overridden(call: Call, override: Override, exposed_schema: dict[str, Any]) -> None:
    """From here on the call carries the arguments the upstream receives (what sign-off and the audit digest see):
    under the upstream's names, with the fixed values. Arguments the exposed schema refuses end the call."""
    try:
        sent = override.arguments(call.arguments, exposed_schema)
        call.given, call.arguments, call.override = call.arguments, sent, override
    except ArgumentsRefused as refused:
        message = f"Invalid arguments for {call.name!r}: {refused}"
        call.denial = Denial("INVALID_ARGUMENTS", message, INVALID_PARAMS)


class StateChanged(Exception):
    """The session's state changed since this process last read it: the call's stages run again."""


async def admit_stage(call: Call) -> None:
    """Admission against shared state (isolation, breaker, limits), which takes the call's share of every limit
    when it admits it, and checks the session's state where the call ran on it unread. Handoff moves take none."""
    if call.route is None or call.own in (ACTIVATE, RETURN):
        return
    assert call.snap is not None and call.caller is not None
    expected = call.unverified.expected if call.unverified is not None else ()
    admission, call.probing, call.denial = await admission_take(
        call.snap, call.caller, call.name, call.route, str(call.request_id), expected
    )
    call.admission = admission if call.denial is None else None
    if call.denial is None or call.denial.code != LIMITS_UNAVAILABLE:
        call.unverified = None  # its script found the session's state as the stages saw it (it checks that first)


async def admission_take(
    snap: Snapshot,
    caller: Caller,
    name: str,
    route: Route,
    request_id: str,
    expected: Expected = (),
) -> tuple[Admission, bool, Denial | None]:
    """The call's admission, whether it is the half-open circuit's probe, and the refusal if it is not admitted;
    StateChanged, taking nothing, if a key of `expected` changed."""
    session = index_session(caller.agent_id, caller.session_key)
    agent = snap.agents[caller.agent_id]
    person = person_digest(caller.person_issuer, caller.person_subject) if caller.person_subject else ""
    stateless = not caller.session_id
    admission = Admission(request_id, session, caller.agent_id, agent, route.limits, stateless, person, expected)
    verdict = await limit_store().admit(admission)
    if verdict.code == STATE_CHANGED:
        raise StateChanged
    if verdict.code:
        return admission, False, limits_denial(admission, verdict, name)
    return admission, verdict.probing, None
