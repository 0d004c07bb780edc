"""Resources, resource templates, prompts and completions of every enabled upstream, under the same namespaces
as tools, filtered by the same rules and audited like calls.

Prompt names are exposed like tool names (`<slug><sep><name>`); resource URIs and URI templates of a prefixed
upstream get its slug and a `+` in front (`time+file:///x`: still a URI, since a scheme may hold `+`, and
reversible, since slugs hold none). An unprefixed upstream keeps its own: names and URIs that carry no known
prefix go to the first unprefixed upstream (that mode is for single-server use).
"""

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from audit.services import canonical_sha256
from audit.telemetry import current_trace_id
from handoff.mcp.agent_relay import AgentRelay
from handoff.mcp.audit_rows import record
from handoff.mcp.caller import Caller, caller_of, legacy_agent, request_span
from handoff.mcp.input_required import passed_through, responses_of
from handoff.mcp.list_changed import resource_subscription
from handoff.mcp.list_changed import subscriptions_listen as listen
from handoff.mcp.paging import list_page
from handoff.mcp.personal_access import credential_for
from handoff.mcp.pinned import KIND_OF_LIST, copies
from handoff.mcp.pipeline.answer import finish
from handoff.mcp.pipeline.frame import request_state_verified
from handoff.mcp.pipeline.routing import admission_take
from handoff.mcp.pipeline.rows import CANCELLED_DETAIL, approval, denial_error, denial_record, request_audit
from handoff.protocol.tunnels import index_session
from handoff.snapshot import Snapshot, UpstreamInfo, snapshot
from handoff.snapshot_tools import Route
from policy.decisions import Denial
from policy.limits.admission import Admission, health_of
from policy.limits.stores import limit_store
from policy.manifest import manifest_sanitize
from policy.redaction import redact
from registry.executor import get_executor
from registry.naming import URI_MARK, exposed_name, exposed_uri, split_exposed_name
from registry.personal import CredentialRef
from registry.upstreams.outcome import Outcome
from registry.upstreams.requests import UNSUPPORTED, UpstreamRequest

logger = logging.getLogger(__name__)

MAX_PAGES = 100  # per upstream and list: an upstream whose cursors never end cannot hold a request forever
NOT_FOUND = "NOT_FOUND"
AUDIT_TEXT = 256  # the audit's name columns; the whole URI goes in the row's detail
PROMPT_TEXT = ("description", "messages")  # what a prompt's pin holds of prompts/get's answer


def _owner_of_uri(snap: Snapshot, caller: Caller, uri: str) -> tuple[UpstreamInfo, str] | None:
    """The upstream a URI leads to for the agent's team (its local prefix for a borrowed upstream included); none
    when the virtual server the caller came through does not offer it."""
    if not snap.offers(caller.server, "resources", uri):
        return None
    namespace, mark, own = uri.partition(URI_MARK)
    target = snap.target_named(caller.who, namespace) if mark else None
    return (target, own) if target is not None else _unprefixed(snap, uri)


def _owner_of_name(snap: Snapshot, caller: Caller, name: str) -> tuple[UpstreamInfo, str] | None:
    if not snap.offers(caller.server, "prompts", name):
        return None
    parts = split_exposed_name(name)
    target = snap.target_named(caller.who, parts[0]) if parts else None
    return (target, parts[1]) if parts and target is not None else _unprefixed(snap, name)


def _unprefixed(snap: Snapshot, own: str) -> tuple[UpstreamInfo, str] | None:
    found = sorted((t for t in snap.targets.values() if not t.namespace and not t.handoff_only), key=lambda t: t.slug)
    return (found[0], own) if found else None


# The lists: the key of each result's items, the field that is namespaced, and how.
LISTS: dict[str, tuple[str, str, Callable[[str, str], str]]] = {
    "resources/list": ("resources", "uri", exposed_uri),
    "resources/templates/list": ("resourceTemplates", "uriTemplate", exposed_uri),
    "prompts/list": ("prompts", "name", exposed_name),
}


def _route(target: UpstreamInfo, own: str) -> Route:
    return Route(target.id, target.slug, target.revision, target.timeout, own, target.limits, target.per_person)


async def _person(caller: Caller, target: UpstreamInfo, name: str) -> CredentialRef | Denial | None:
    """Whose credential a request to a per-person upstream carries (None for a shared one), or why it has none."""
    return await credential_for(caller, _route(target, name), name) if target.per_person else None


async def _every_page(target: UpstreamInfo, method: str, person: CredentialRef | None = None) -> list[dict[str, Any]]:
    """All of one upstream's items; none when it does not offer the feature or cannot be reached (logged)."""
    key = LISTS[method][0]
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(MAX_PAGES):
        params = {"cursor": cursor} if cursor else {}
        wire = person.wire() if person else None
        outcome = await get_executor().request(
            UpstreamRequest(target.id, target.revision, method, params, timeout=target.timeout, person=wire)
        )
        if not outcome["ok"]:
            if outcome["code"] != UNSUPPORTED:
                logger.warning("%s of %s failed: %s", method, target.slug, outcome.get("detail"))
            return items
        items += outcome["result"].get(key) or []
        if not (cursor := outcome["result"].get("nextCursor")):
            break
    return items


async def _aggregated(ctx: ServerRequestContext, method: str, params: types.PaginatedRequestParams | None) -> Any:
    caller, snap = caller_of(ctx), await snapshot.get()
    key, field, expose = LISTS[method]
    targets = [t for t in snap.targets.values() if t.reachable and not t.handoff_only]
    people = await asyncio.gather(*(_person(caller, target, method) for target in targets))
    # A per-person upstream lists what the caller's own account there holds; without a usable credential, nothing.
    targets = [t for t, person in zip(targets, people, strict=True) if not isinstance(person, Denial)]
    people = [person for person in people if not isinstance(person, Denial)]
    listed = await asyncio.gather(*(_every_page(t, method, p) for t, p in zip(targets, people, strict=True)))
    pins, kind = await copies.at(snap.version), KIND_OF_LIST[method]
    items = []
    for target, entries in zip(targets, listed, strict=True):
        for live in entries:
            own = live.get(field)
            # A changed entry is listed as approved; one never approved, not at all (pinned.py).
            if not isinstance(own, str) or (entry := pins.entry(target, kind, own, live)) is None:
                continue
            exposed = expose(snap.namespace_for(caller.who, target), own)
            offered = snap.offers(caller.server, "prompts" if field == "name" else "resources", exposed)
            if offered and snap.permits(caller.who, target, exposed, own) is None:
                items.append(manifest_sanitize(entry) | {field: exposed})
    page, following = list_page(method, items, params.cursor if params else None)
    return finish(ctx, {key: page} | ({"nextCursor": following} if following else {}))


async def list_resources(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> Any:
    return await _aggregated(ctx, "resources/list", params)


async def list_resource_templates(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> Any:
    return await _aggregated(ctx, "resources/templates/list", params)


async def list_prompts(ctx: ServerRequestContext, params: types.PaginatedRequestParams | None) -> Any:
    return await _aggregated(ctx, "prompts/list", params)


def _not_found(what: str, exposed: str, listing: str) -> MCPError:
    message = f"Unknown {what}: {exposed!r}. Call {listing} for what this gateway offers."
    data = {"code": NOT_FOUND} | ({"uri": exposed} if what == "resource" else {})
    return MCPError(types.INVALID_PARAMS, message, data)


async def _rounds(
    ctx: ServerRequestContext, name: str, owner: tuple[UpstreamInfo, str] | None, params: Any
) -> dict[str, Any] | None:
    """For a 2026-07-28 agent's prompts/get or resources/read: what passes an upstream's input-required
    rounds through (input_required.py); None for a 2025-11-25 agent, whose upstream asks on the request's stream."""
    if legacy_agent(ctx):
        return None
    if params.request_state is None:
        return {"inputResponses": responses_of(params)} if params.input_responses else {}
    upstream = owner[0].slug if owner else ""
    state = await request_state_verified(caller_of(ctx), name, upstream, params.request_state, {})
    return {"requestState": state.get("s"), "inputResponses": responses_of(params)}


async def _forward(
    ctx: ServerRequestContext,
    method: str,
    exposed: str,
    owner: tuple[UpstreamInfo, str] | None,
    params: dict[str, Any],
    not_found: MCPError,
    rounds: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Decide, record the approval, forward to the owner, record the completion: a tool call's path, for a
    read, a prompt or a completion. Refusals and upstream errors are JSON-RPC errors."""
    caller, snap, request_id, relay = caller_of(ctx), await snapshot.get(), uuid.uuid4(), AgentRelay(ctx)
    target, own = owner if owner else (None, "")
    audit = request_audit(
        caller,
        exposed[:AUDIT_TEXT],
        request_id,
        canonical_sha256(params),
        target.slug if target else "",
        own[:AUDIT_TEXT],
        current_trace_id(),
    )
    audit["detail"] = {"method": method, "name": exposed}
    if target is None:
        message = not_found.error.message
        await record(kind="denied", outcome="denied", error_code=NOT_FOUND, error_detail=message, **audit)
        raise not_found
    route = _route(target, own)
    denial = snap.permits(caller.who, target, exposed, own)
    person = None if denial else await _person(caller, target, exposed)
    denial = denial or (person if isinstance(person, Denial) else None)
    admission, probing = None, False
    if not denial:
        admission, probing, denial = await admission_take(snap, caller, exposed, route, str(request_id))
    if denial:
        await denial_record(denial, audit, params)
        raise denial_error(denial, request_id)
    assert admission is not None
    try:
        await record(kind="approved", **approval(audit, params, target.timeout))  # before the upstream is touched
    except BaseException:
        with anyio.CancelScope(shield=True):
            await limit_store().release(admission, "none", probing)
        raise
    started, outcome = time.perf_counter(), None
    try:
        wire = person.wire() if isinstance(person, CredentialRef) else None
        legacy = legacy_agent(ctx)
        request = UpstreamRequest(
            target.id, target.revision, method, params, target.timeout, rounds=rounds, person=wire, legacy=legacy
        )
        outcome = await get_executor().request(request, relay)
    finally:
        with anyio.CancelScope(shield=True):
            await _complete(audit, admission, probing, outcome, started)
    if not outcome["ok"]:
        message = outcome["message"] if outcome.get("validation") else redact(outcome["message"])
        code = outcome.get("rpc_code", types.INTERNAL_ERROR)
        data = {"code": outcome["code"], "requestId": str(request_id)}
        raise MCPError(code, message, data | ({"uri": exposed} if method == "resources/read" else {}))
    result = outcome["result"]
    if result.get("resultType") == "input_required":
        return passed_through(caller, exposed, target.slug, result, relay.capabilities)
    return result


async def _complete(
    audit: dict[str, Any], admission: Admission, probing: bool, outcome: Outcome | None, started: float
) -> None:
    """The completion row and the admission's release; a request the client left has no outcome."""
    duration_ms = (time.perf_counter() - started) * 1000
    if outcome is None:
        fields = {
            "outcome": "error",
            "error_code": "CANCELLED",
            "error_detail": CANCELLED_DETAIL,
        }
    elif outcome["ok"]:
        fields = {"outcome": "ok", "response_bytes": len(json.dumps(outcome["result"]))}
    else:
        fields = {"outcome": "error", "error_code": outcome["code"], "error_detail": outcome.get("detail", "")}
    health = health_of(outcome.get("code")) if outcome else "none"
    await asyncio.gather(
        record(kind="completed", duration_ms=duration_ms, **fields, **audit),
        limit_store().release(admission, health, probing),
    )


async def read_resource(ctx: ServerRequestContext, params: types.ReadResourceRequestParams) -> Any:
    with request_span(ctx, "resources/read", uri=params.uri):
        return await _read_resource(ctx, params)


async def _read_resource(ctx: ServerRequestContext, params: types.ReadResourceRequestParams) -> Any:
    snap = await snapshot.get()
    owner = _owner_of_uri(snap, caller_of(ctx), params.uri)
    not_found = _not_found("resource", params.uri, "resources/list")
    rounds = await _rounds(ctx, params.uri, owner, params)
    forwarded = {"uri": owner[1] if owner else ""}
    result = await _forward(ctx, "resources/read", params.uri, owner, forwarded, not_found, rounds)
    assert owner is not None
    if result.get("resultType") == "input_required":
        return result
    namespace = snap.namespace_for(caller_of(ctx).who, owner[0])
    contents = [
        item | {"uri": exposed_uri(namespace, item["uri"])} if isinstance(item.get("uri"), str) else item
        for item in result.get("contents") or []
    ]
    return finish(ctx, result | {"contents": contents})


async def get_prompt(ctx: ServerRequestContext, params: types.GetPromptRequestParams) -> Any:
    with request_span(ctx, "prompts/get", prompt=params.name):
        snap = await snapshot.get()
        owner, pins = _owner_of_name(snap, caller_of(ctx), params.name), await copies.at(snap.version)
        if owner and not pins.prompt_known(*owner):
            owner = None  # never approved: as absent as from prompts/list
        forwarded = {"name": owner[1] if owner else "", "arguments": params.arguments or {}}
        not_found = _not_found("prompt", params.name, "prompts/list")
        rounds = await _rounds(ctx, params.name, owner, params)
        result = await _forward(ctx, "prompts/get", params.name, owner, forwarded, not_found, rounds)
        assert owner is not None
        if not params.arguments and result.get("resultType") != "input_required":
            result = _as_pinned(result, pins.prompt_text(*owner), params.name)
        return finish(ctx, result)


def _as_pinned(result: dict[str, Any], approved: dict[str, Any] | None, exposed: str) -> dict[str, Any]:
    """The prompt's text as approved, whatever the upstream says now (a changed text waits for approval)."""
    said = {key: result.get(key) for key in PROMPT_TEXT if key in result}
    if approved is None or said == {key: approved.get(key) for key in PROMPT_TEXT if key in approved}:
        return result
    logger.info("prompt %s: its text changed at the upstream; the approved one is served", exposed)
    return {key: value for key, value in result.items() if key not in PROMPT_TEXT} | approved


async def complete(ctx: ServerRequestContext, params: types.CompleteRequestParams) -> Any:
    snap, caller = await snapshot.get(), caller_of(ctx)
    wire = params.model_dump(mode="json", by_alias=True, exclude_none=True)
    wire.pop("_meta", None)
    if isinstance(params.ref, types.PromptReference):
        exposed, owner, field = params.ref.name, _owner_of_name(snap, caller, params.ref.name), "name"
        not_found = _not_found("prompt", exposed, "prompts/list")
    else:
        exposed, owner, field = params.ref.uri, _owner_of_uri(snap, caller, params.ref.uri), "uri"
        not_found = _not_found("resource template", exposed, "resources/templates/list")
    wire["ref"][field] = owner[1] if owner else ""
    return finish(ctx, await _forward(ctx, "completion/complete", exposed, owner, wire, not_found))


async def subscribe_resource(ctx: ServerRequestContext, params: types.SubscribeRequestParams) -> types.EmptyResult:
    return await _subscription(ctx, params.uri, subscribed=True)


async def unsubscribe_resource(ctx: ServerRequestContext, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    return await _subscription(ctx, params.uri, subscribed=False)


async def _subscription(ctx: ServerRequestContext, uri: str, subscribed: bool) -> types.EmptyResult:
    """(Un)subscribe at the upstream, and remember who hears of the resource's updates (list_changed.py)."""
    owner = _owner_of_uri(await snapshot.get(), caller_of(ctx), uri)
    method = "resources/subscribe" if subscribed else "resources/unsubscribe"
    await _forward(
        ctx, method, uri, owner, {"uri": owner[1] if owner else ""}, _not_found("resource", uri, "resources/list")
    )
    caller = caller_of(ctx)
    resource_subscription(index_session(caller.agent_id, caller.session_key), uri, subscribed)
    return types.EmptyResult()


async def subscriptions_listen(
    ctx: ServerRequestContext, params: types.SubscriptionsListenRequestParams
) -> types.SubscriptionsListenResult:
    """A 2026-07-28 agent subscribes to resources on its listen stream: each resource's upstream is asked
    for its updates (decided and audited like resources/subscribe), then the stream is served (list_changed.py)."""
    for uri in params.notifications.resource_subscriptions or ():
        owner = _owner_of_uri(await snapshot.get(), caller_of(ctx), uri)
        not_found = _not_found("resource", uri, "resources/list")
        await _forward(ctx, "resources/subscribe", uri, owner, {"uri": owner[1] if owner else ""}, not_found)
    return await listen(ctx, params)
