"""Tunnels: where each handed-off session stands.

Two records, each with one job. The `Tunnel` row is the truth an operator and the sweeper see (state,
owner worker, last use), changed only by conditional updates so that a return, a sweep and a lost worker
never both close the same tunnel. The session index is what every request of the session reads first, so
it must be cheap: a Redis key per session (the embedded default: this process's memory) holding the
tunnel's domain, its worker queue and its tools.
"""

import json
import threading
import uuid
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any, Protocol

from celery import current_app
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from audit.services import audit_record
from gateway_project.lib import redis_clients
from handoff.models import Tunnel
from registry.upstreams.loop import held_tunnel_close, held_tunnels

# Far past any idle timeout (at most a day), so an entry outlives its tunnel only when a process died
# mid-close, and then not for ever.
INDEX_TTL_SECONDS = 7 * 86_400


@dataclass
class SessionTunnel:
    """The session index's entry: enough to route the session's next request without the database."""

    tunnel_id: str
    domain: str
    upstream_slug: str
    state: str = Tunnel.State.CONNECTING
    queue: str = ""
    tools: dict[str, str] = field(default_factory=dict)  # exposed name -> the specialist's own name
    definitions: list[dict[str, Any]] = field(default_factory=list)  # tools/list payload during the handoff
    summary_tool: bool = False  # the specialist offers its own return_to_triage, which writes the summary

    @property
    def is_open(self) -> bool:
        return self.state == Tunnel.State.OPEN

    @property
    def token_id(self) -> str:
        """The delegation's `tid` (Tunnel.token_id), for the audit of each tunnelled call."""
        return uuid.UUID(self.tunnel_id).hex


class SessionIndex(Protocol):
    async def get(self, session: str) -> SessionTunnel | None: ...

    async def put(self, session: str, entry: SessionTunnel) -> None: ...

    async def forget(self, session: str, tunnel_id: str) -> None:
        """Forget the session's tunnel if it is still this one (a newer handoff of the session stays)."""

    def drop(self, session: str, tunnel_id: str) -> None:
        """`forget`, for the sweeper and worker shutdown, which are not async."""


class SessionStateUnavailable(Exception):
    """The session index could not be read: whether the session is handed off is unknown."""


# A session's entry as its request's front door read it, in one round trip with the session's record
# (handoff/endpoints/streamable_http/redis_sessions.py): the request's first look at the index takes it instead
# of asking Redis again; any later look asks. A list of one (session, raw), emptied when taken: the tasks the
# request starts hold the same list in their copies of the context, so it is taken once in all of them.
_read_ahead: ContextVar[list[tuple[str, bytes | None]] | None] = ContextVar("session_index_read_ahead", default=None)


def index_read_ahead(session: str, raw: bytes | None) -> None:
    """What the index holds for `session` (`index_session`) now, read by this request's front door."""
    _read_ahead.set([(session, raw)])


class RedisSessionIndex:
    # Deletes only if the entry still names this tunnel: a newer handoff of the session stays.
    DROP = "local v = redis.call('GET', KEYS[1]) if v and cjson.decode(v).tunnel_id == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"  # noqa: E501

    @staticmethod
    def key(session: str) -> str:
        return f"{settings.GATEWAY_REDIS_PREFIX}tunnel:{session}"

    async def get(self, session: str) -> SessionTunnel | None:
        ahead = _read_ahead.get()
        if ahead and ahead[0][0] == session:
            raw = ahead.pop()[1]
        else:
            try:
                # Not redis-py's client where the line serves (several times its CPU): every call the door did
                # not read ahead for (a stateless request's, a WebSocket's) asks.
                raw = await redis_clients.command("GET", self.key(session))
            except redis_clients.RedisError as exc:
                raise SessionStateUnavailable(str(exc)) from exc
        return None if raw is None else SessionTunnel(**json.loads(raw))

    async def put(self, session: str, entry: SessionTunnel) -> None:
        await redis_clients.async_redis().set(self.key(session), json.dumps(asdict(entry)), ex=INDEX_TTL_SECONDS)

    async def forget(self, session: str, tunnel_id: str) -> None:
        await redis_clients.async_redis().eval(self.DROP, 1, self.key(session), tunnel_id)

    def drop(self, session: str, tunnel_id: str) -> None:
        redis_clients.sync_redis().eval(self.DROP, 1, self.key(session), tunnel_id)


class LocalSessionIndex:
    def __init__(self) -> None:
        self._entries: dict[str, SessionTunnel] = {}
        self._lock = threading.Lock()  # the sweeper drops from a worker thread

    async def get(self, session: str) -> SessionTunnel | None:
        return self._entries.get(session)

    async def put(self, session: str, entry: SessionTunnel) -> None:
        with self._lock:
            self._entries[session] = entry

    async def forget(self, session: str, tunnel_id: str) -> None:
        self.drop(session, tunnel_id)

    def drop(self, session: str, tunnel_id: str) -> None:
        with self._lock:
            if (entry := self._entries.get(session)) and entry.tunnel_id == tunnel_id:
                del self._entries[session]


@cache
def session_index() -> SessionIndex:
    return RedisSessionIndex() if settings.REDIS_URL else LocalSessionIndex()


def index_session(agent_id: int, session_key: str) -> str:
    return f"{agent_id}:{session_key}"


# --- Rows ---------------------------------------------------------------------------------------------


class TunnelRefused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


def tunnel_create(*, agent_id: int, session_key: str, domain: str, upstream_id: int, route_id: int | None,
                  max_sessions: int, idle_timeout: float) -> Tunnel:  # fmt: skip
    """A connecting tunnel, or TunnelRefused: SESSION_LIMIT_EXCEEDED past the route's `max_sessions`,
    HANDOFF_CONNECTING when this session already has one live."""
    try:
        with transaction.atomic():
            live = Tunnel.objects.select_for_update().filter(upstream_id=upstream_id, state__in=Tunnel.LIVE)
            if route_id is not None:
                live = live.filter(route_id=route_id)
            if len(live) >= max_sessions:
                raise TunnelRefused("SESSION_LIMIT_EXCEEDED")
            return Tunnel.objects.create(
                agent_id=agent_id,
                session_key=session_key,
                domain=domain,
                upstream_id=upstream_id,
                route_id=route_id,
                idle_timeout=idle_timeout,
            )
    except IntegrityError:
        raise TunnelRefused("HANDOFF_CONNECTING") from None


def tunnel_opened(tunnel_id: str, queue: str) -> bool:
    now = timezone.now()
    opened = Tunnel.objects.filter(pk=tunnel_id, state=Tunnel.State.CONNECTING)
    return bool(opened.update(state=Tunnel.State.OPEN, worker_queue=queue, opened_at=now, last_used_at=now))


def tunnel_touch(tunnel_id: str) -> bool:
    """Note a use; False when the tunnel is no longer open (swept or closed meanwhile)."""
    return bool(Tunnel.objects.filter(pk=tunnel_id, state=Tunnel.State.OPEN).update(last_used_at=timezone.now()))


def tunnel_end(tunnel_id: str, reason: str, **extra: Any) -> bool:
    """Close a live tunnel's row; True for the one caller that closed it."""
    live = Tunnel.objects.filter(pk=tunnel_id, state__in=Tunnel.LIVE, **extra)
    return bool(live.update(state=Tunnel.State.CLOSED, closed_at=timezone.now(), close_reason=reason))


def handoff_row(
    event: str, *, domain: str, tunnel_id: str, token_id: str, detail: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    """The audit row of a handoff event (for `audit_record`, or `record` in async code)."""
    ids = {"event": event, "domain": domain, "tunnel_id": tunnel_id, "token_id": token_id}
    outcome = "error" if fields.get("error_code") else "ok"
    return {"kind": "handoff", "outcome": outcome, "detail": ids | (detail or {}), **fields}


def tunnel_close_out(
    tunnel: Tunnel, reason: str, *, actor: str = "", close_upstream: bool = True, **conditions: Any
) -> bool:
    """Close a tunnel from outside its session (sweep, operator, shutdown): the row, the worker's upstream
    session, the session index and the audit. The agent is told by the caller (handoff/mcp/list_changed.py)."""
    if not tunnel_end(str(tunnel.id), reason, **conditions):
        return False
    if close_upstream:
        _executor_close(str(tunnel.id), tunnel.worker_queue)
    session_index().drop(index_session(tunnel.agent_id, tunnel.session_key), str(tunnel.id))
    audit_record(
        **handoff_row(
            reason,
            domain=tunnel.domain,
            tunnel_id=str(tunnel.id),
            token_id=tunnel.token_id,
            agent_id=tunnel.agent_id,
            team=Tunnel.objects.filter(pk=tunnel.pk).values_list("agent__team__slug", flat=True).first() or "",
            session_id=tunnel.session_key,
            upstream=tunnel.upstream.slug,
            actor=actor,
        )
    )
    return True


def _executor_close(tunnel_id: str, queue: str) -> None:
    """Close the upstream session where it is held: a worker's queue, or the embedded default's own pool.
    A Celery tunnel with no queue yet is still connecting: its opener finds the row closed and closes it."""
    if queue:
        current_app.send_task("registry.tunnel_close", kwargs={"tunnel_id": tunnel_id}, queue=queue, expires=60)
    elif settings.GATEWAY_EXECUTOR == "inline":
        held_tunnel_close(tunnel_id)


def tunnels_sweep_idle(*, in_process: bool) -> list[Tunnel]:
    """Close every open tunnel idle past its timeout: those held by this process (embedded default), or
    those held by Celery workers. The update is conditional on the last use the sweep read, so a call that
    touched the tunnel meanwhile keeps it open."""
    now = timezone.now()
    # Live tunnels are few (each route caps them), so the idle test runs here rather than in SQL. A tunnel
    # still "connecting" past its idle timeout lost its opener (a web process that died mid-handoff).
    held = Q(worker_queue="") if in_process else ~Q(worker_queue="")
    live = Tunnel.objects.filter((Q(state=Tunnel.State.OPEN) & held) | Q(state=Tunnel.State.CONNECTING))
    return [
        tunnel
        for tunnel in live.select_related("upstream")
        if tunnel.is_idle(now) and tunnel_close_out(tunnel, "idle", last_used_at=tunnel.last_used_at)
    ]


def tunnels_close_held(reason: str) -> list[Tunnel]:
    """At shutdown: close the rows of the tunnels this process holds (its pool closes their upstream
    sessions as the process ends) and forget them; the caller tells the agents, if they can still hear."""
    held = Tunnel.objects.filter(pk__in=held_tunnels(), state__in=Tunnel.LIVE).select_related("upstream")
    return [t for t in held if tunnel_close_out(t, reason, close_upstream=False)]
