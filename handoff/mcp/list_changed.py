"""Telling agents that their tools changed (a handoff opened, returned, was swept or lost), or that an
upstream's tools, prompts or resources changed: only the sessions whose list that changed hear of it
(session_views.py: a tools list is compared before and after; prompts and resources reach the sessions that may
reach the upstream).

2025-11-25 sessions (and /mcp/ws sockets) get `notifications/tools/list_changed` on their own stream;
2026-07-28 callers through `subscriptions/listen` streams, which this module serves per session: a
listener hears only its own session's changes. A change may happen in another process (the sweeper runs
on a Celery worker; a stateless caller's listen stream may be held by another web process), so every change
goes through the channel layer to every web process, and each tells the sessions it holds.
"""

import asyncio
import contextvars
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import (
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp.types import SubscriptionsListenRequestParams, SubscriptionsListenResult

from gateway_project.lib.channel_groups import membership_kept
from gateway_project.lib.process_task import ProcessTask
from handoff.mcp.caller import Caller, caller_of
from handoff.mcp.pipeline.task_state import tasks_forget
from handoff.mcp.session_views import SessionView, session_view_of, session_views_changed, session_views_reaching
from handoff.protocol.tunnels import index_session
from handoff.snapshot import Snapshot, snapshot
from registry.naming import exposed_uri
from registry.upstreams.connection import UPDATED

logger = logging.getLogger(__name__)
GROUP = "switchboard.tools-changed"
_listening: contextvars.ContextVar[str] = contextvars.ContextVar("listening_session", default="")


class SessionBus:
    """A SubscriptionBus whose listeners belong to sessions: `ListenHandler` subscribes inside the listen
    request, where `_listening` names the caller's session."""

    def __init__(self) -> None:
        self._listeners: dict[str, set[Callable[[ServerEvent], None]]] = {}

    async def publish(self, event: ServerEvent) -> None:
        for listeners in list(self._listeners.values()):
            for listener in list(listeners):
                listener(event)

    def sessions(self) -> set[str]:
        return set(self._listeners)

    def publish_to(self, session: str, event: ServerEvent) -> None:
        for listener in list(self._listeners.get(session, ())):
            listener(event)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        session = _listening.get()
        self._listeners.setdefault(session, set()).add(listener)

        def unsubscribe() -> None:
            listeners = self._listeners.get(session, set())
            listeners.discard(listener)
            if not listeners:
                self._listeners.pop(session, None)

        return unsubscribe


bus = SessionBus()
_listen = ListenHandler(bus)
# Legacy and WebSocket sessions that handed off, so a change made elsewhere can reach their stream. The
# SDK's ServerSession is a per-request view of the connection: it is held here (the newest, bounded), not
# weakly, or it would be gone with the request that handed off. It holds the whole session (its transport's
# object too), so it leaves when the session does (`session_forget`), not only when newer ones push it out.
_streams: OrderedDict[str, Any] = OrderedDict()
# What each session held here sees (session_views.py), kept from its first request (or listen stream) on.
_views: OrderedDict[str, SessionView] = OrderedDict()
# Every table of per-session state this process keeps: the streams, the views, the log levels (agent_relay.py).
_tables: list[OrderedDict[str, Any]] = [_streams, _views]


async def subscriptions_listen(
    ctx: ServerRequestContext, params: SubscriptionsListenRequestParams
) -> SubscriptionsListenResult:
    caller = caller_of(ctx)
    session = index_session(caller.agent_id, caller.session_key)
    view_remember(session, caller)
    token = _listening.set(session)
    try:
        return await _listen(ctx, params)
    finally:
        _listening.reset(token)


class RememberSessions:
    """Server middleware: every 2025-11-25 (and WebSocket) session is held, so that a change can reach it."""

    async def __call__(self, ctx: ServerRequestContext, call_next: Callable[[ServerRequestContext], Any]) -> Any:
        caller = caller_of(ctx) if ctx.request is not None else None
        if caller is not None and caller.session_id:
            session = index_session(caller.agent_id, caller.session_key)
            session_remember(session, ctx.session)
            view_remember(session, caller)
        return await call_next(ctx)


def per_session(table: OrderedDict[str, Any], session: str, value: Any) -> None:
    """Keep `value` for the session in `table`, which holds the newest sessions' only (as many as the SDK may
    keep open), so a process's memory stays flat however many come and go."""
    table[session] = value
    table.move_to_end(session)
    while len(table) > settings.GATEWAY_MAX_LEGACY_SESSIONS:
        table.popitem(last=False)


def per_session_table() -> OrderedDict[str, Any]:
    """A new table of per-session state, whose entries `session_forget` drops with their session."""
    table: OrderedDict[str, Any] = OrderedDict()
    _tables.append(table)
    return table


def session_remember(session: str, server_session: Any) -> None:
    per_session(_streams, session, server_session)


def view_remember(session: str, caller: Caller) -> None:
    """The session's view, from its first request on; only its tools/list moves the snapshot it is compared on."""
    if session not in _views and snapshot.latest is not None:  # every request has read the snapshot by now
        per_session(_views, session, session_view_of(caller=caller, snap=snapshot.latest))


def view_listed(caller: Caller, snap: Snapshot) -> SessionView:
    """The session was given its tools list from `snap`: a change is compared with what it holds now. (Stateless
    2026-07-28 requests of one key or person share a view: what the latest of them listed.)"""
    view = session_view_of(caller=caller, snap=snap)
    per_session(_views, index_session(caller.agent_id, caller.session_key), view)
    return view


async def tools_changed_here(session: str) -> None:
    bus.publish_to(session, ToolsListChanged())
    stream = _streams.get(session)
    if stream is not None:
        try:
            await stream.send_tool_list_changed()
        except Exception:  # the client went away: nothing left to tell
            logger.info("session %s no longer takes notifications", session, exc_info=True)
            _streams.pop(session, None)


# What changed in an upstream: the event for 2026-07-28 listeners, the notification for legacy streams.
LISTS: dict[str, tuple[type, str]] = {
    "tools": (ToolsListChanged, "send_tool_list_changed"),
    "prompts": (PromptsListChanged, "send_prompt_list_changed"),
    "resources": (ResourcesListChanged, "send_resource_list_changed"),
}


async def _sessions_told(kind: str, upstream_id: int, snap: Snapshot) -> list[str]:
    """The sessions held here whose `kind` list the upstream's change may have changed; a session whose view
    this process no longer keeps (pushed out by newer ones) is told, to be safe."""
    held = set(_streams) | bus.sessions()
    if kind == "tools":
        changed = set(await session_views_changed(views=_views, snap=snap))
        return sorted(s for s in held if s not in _views or s in changed)
    reaching = session_views_reaching(views=_views, snap=snap, upstream_id=upstream_id)
    return sorted(s for s in held if s not in _views or s in reaching)


async def list_changed_here(kind: str, upstream_id: int, snap: Snapshot) -> None:
    """The sessions held here whose list changed hear of it, on their listen stream or their own stream."""
    event, notify = LISTS[kind]
    for session in await _sessions_told(kind, upstream_id, snap):
        bus.publish_to(session, event())
        if (stream := _streams.get(session)) is None:
            continue
        try:
            await getattr(stream, notify)()
        except Exception:  # the client went away: nothing left to tell
            _streams.pop(session, None)


# 2025-11-25 sessions subscribed to a resource, by its exposed URI.
_subscribers: dict[str, set[str]] = {}


def resource_subscription(session: str, uri: str, subscribed: bool) -> None:
    if subscribed:
        _subscribers.setdefault(uri, set()).add(session)
    elif uri in _subscribers:
        _subscribers[uri].discard(session)
        if not _subscribers[uri]:
            del _subscribers[uri]


def session_forget(caller: Caller) -> None:
    """The caller's session ended, or this process no longer holds it: nothing of it stays here."""
    session = index_session(caller.agent_id, caller.session_key)
    for table in _tables:
        table.pop(session, None)
    for uri in [uri for uri, sessions in _subscribers.items() if session in sessions]:
        resource_subscription(session, uri, subscribed=False)
    tasks_forget(caller.session_id)


async def resource_updated_here(uri: str) -> None:
    await bus.publish(ResourceUpdated(uri=uri))  # 2026-07-28 listeners that named the resource
    for session in list(_subscribers.get(uri, ())):
        stream = _streams.get(session)
        try:
            if stream is None:
                raise LookupError(session)
            await stream.send_resource_updated(uri)
        except Exception:  # the client went away: nothing left to tell
            resource_subscription(session, uri, subscribed=False)


async def upstream_changed_tell(upstream_id: int, kind: str) -> None:
    """The pool's listener (registry/upstreams/loop.py): the agents whose list changed are told so, in whichever
    process holds their stream, or the agents subscribed to a resource that it did."""
    if kind.startswith(UPDATED):
        await resource_updated_everywhere(upstream_id, kind.removeprefix(UPDATED))
    else:
        await list_changed_everywhere(kind, upstream_id)


async def resource_updated_everywhere(upstream_id: int, uri: str) -> None:
    await get_channel_layer().group_send(GROUP, {"type": "resource.updated", "upstream": upstream_id, "uri": uri})


async def list_changed_everywhere(kind: str, upstream_id: int) -> None:
    await get_channel_layer().group_send(GROUP, {"type": "list.changed", "kind": kind, "upstream": upstream_id})


async def tools_changed_everywhere(sessions: list[str]) -> None:
    layer = get_channel_layer()
    for session in sessions:
        await layer.group_send(GROUP, {"type": "tools.changed", "session": session})


# Handlers of other kinds of message the relay carries, by type: a transport's own (a client's message for
# a session another process waits in: handoff/endpoints/streamable_http/legacy.py).
relay_handlers: dict[str, Callable[[dict], Awaitable[None]]] = {}


async def relay_everywhere(message: dict) -> None:
    """`message` to every web process's relay, this one's included."""
    await get_channel_layer().group_send(GROUP, message)


async def _relay(ready: asyncio.Future) -> None:
    """This process's ear on the channel layer: changes from anywhere, told to the sessions held here."""
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(GROUP, channel)
    ready.set_result(None)
    refreshing = asyncio.create_task(membership_kept(layer, GROUP, channel))
    try:
        while True:
            message = await layer.receive(channel)
            if message.get("type") == "tools.changed":
                await tools_changed_here(message["session"])
            elif message.get("type") == "resource.updated":
                snap = await snapshot.get()
                target = next((t for t in snap.targets.values() if t.id == message["upstream"]), None)
                for namespace in snap.namespaces_of(target) if target is not None else ():  # a borrower's name too
                    await resource_updated_here(exposed_uri(namespace, message["uri"]))
            elif message.get("type") == "list.changed" and message.get("kind") in LISTS:
                snapshot.invalidate()  # compared at once, on the new catalog (the resync committed before)
                await list_changed_here(message["kind"], message.get("upstream", 0), await snapshot.get())
            elif (handler := relay_handlers.get(message.get("type", ""))) is not None:
                try:
                    await handler(message)
                except Exception:  # one bad message must not stop the relay
                    logger.exception("the relay's %s handler failed", message.get("type"))
    finally:
        refreshing.cancel()


change_relay = ProcessTask(_relay)
