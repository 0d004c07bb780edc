"""2025-11-25 sessions over HTTP: who opened each (only they may use it), its MCP-layer state, its streams
(each request's answered as SSE, and the session's own for what is sent outside any request, which a GET
reads), and whether it is in use. Two stores behind one interface: `LocalSessions` keeps them in this
process (the embedded default); `RedisSessions` (redis_sessions.py) in Redis, for any web process to serve.
Both count the sessions each principal opens against its bound (handoff/session_limit.py), and a session they
no longer hold leaves what the MCP layer kept of it (handoff/mcp/list_changed.py's `session_forget`)."""

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Protocol

from mcp import types

from handoff.endpoints.streamable_http.streams import EventStream, ReplayBuffer
from handoff.mcp.caller import Caller
from handoff.mcp.frames import encode_message
from handoff.mcp.handle import McpSession
from handoff.mcp.list_changed import session_forget
from handoff.session_limit import LocalSessionLimit, SessionsFull

# The same answer for an id that never existed, one that ended, and another principal's: nothing tells whose.
NOT_FOUND = "Session not found: it ended, expired or never existed; send initialize to open a new one"
PROCESS_FULL = (
    "Server busy: this gateway process holds as many sessions as it may (GATEWAY_MAX_LEGACY_SESSIONS). Retry in 5 s."
)


class Readable(Protocol):
    """A stream a GET can read: its events after a point, as SSE frames."""

    def event_id(self, number: int) -> str | None: ...
    async def missed(self, after: int) -> int: ...
    def frames(self, after: int, idle: float) -> AsyncIterator[bytes]: ...


class Streams(Protocol):
    def stream(self) -> EventStream: ...
    def resumable(self, stream: EventStream) -> None: ...
    async def push(self, data: str) -> None: ...
    async def reader(self, event_id: str | None) -> tuple[Readable, int, bool] | None: ...
    async def close(self) -> None: ...


@dataclass(eq=False)
class HttpSession:
    owner: Caller  # with the session's id
    streams: Streams
    version: str = ""  # the protocol version the handshake settled on
    listening: bool = False  # a GET reads the session's own stream here
    busy: int = 0  # requests running, and open streams
    ended: bool = False  # found ended elsewhere by a call that ran on its state unread (redis_sessions.py)
    seen: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.mcp = McpSession(self._push, id=self.id)

    @property
    def id(self) -> str:
        return self.owner.session_id

    def touch(self) -> None:
        self.seen = time.monotonic()

    async def _push(self, message: types.JSONRPCMessage) -> None:
        if (data := encode_message(message)) is not None:
            await self.streams.push(data)

    async def close(self) -> None:
        await self.mcp.close()
        await self.streams.close()


class LocalStreams:
    """A session's streams in this process, each resumable while the replay bound keeps its events."""

    def __init__(self, session_id: str, replay: ReplayBuffer) -> None:
        self._prefix = session_id[:8]
        self._replay = replay
        self._numbers = itertools.count()
        self._kept: dict[str, EventStream] = {}
        self.own = self.stream()
        self.resumable(self.own)

    def stream(self) -> EventStream:
        return EventStream(f"{self._prefix}-{next(self._numbers)}", self._replay)

    def resumable(self, stream: EventStream) -> None:
        for old in [key for key, kept in self._kept.items() if kept.done and kept.gone(0) >= kept.count]:
            del self._kept[old]  # ended, and every event of it gone: nothing to resume
        stream.keep()
        self._kept[stream.id] = stream

    async def push(self, data: str) -> None:
        self.own.put(data)

    async def reader(self, event_id: str | None) -> tuple[Readable, int, bool] | None:
        """The stream a GET reads (with `Last-Event-ID`: the one the id names, if it is this session's), where
        to start, and whether it is the session's own."""
        if event_id is None:
            return self.own, self.own.count, True
        stream_id, _, number = event_id.rpartition(":")
        stream = self._kept.get(stream_id)
        return (stream, int(number), stream is self.own) if stream is not None and number.isdigit() else None

    async def close(self) -> None:
        for stream in self._kept.values():
            stream.close()
            stream.drop_through(stream.count)


class LocalSessions:
    def __init__(self, capacity: int, limit: LocalSessionLimit, idle_seconds: float, replay_events: int) -> None:
        self._sessions: dict[str, HttpSession] = {}
        self._capacity, self._limit = capacity, limit
        self._idle = idle_seconds
        self._replay = ReplayBuffer(replay_events)

    def __len__(self) -> int:
        return len(self._sessions)

    async def open(self, caller: Caller) -> HttpSession:
        """A new session for `caller`; SessionsFull when the process holds as many as it may, or the principal
        opened as many as it may."""
        if len(self._sessions) >= self._capacity:
            raise SessionsFull(503, PROCESS_FULL, 5)
        owner = replace(caller, session_id=uuid.uuid4().hex)
        await self._limit.admit(owner)
        session = HttpSession(owner, LocalStreams(owner.session_id, self._replay))
        self._sessions[session.id] = session
        return session

    async def save(self, session: HttpSession) -> None:
        """Nothing to do: the session is the object itself."""

    async def get(self, session_id: str, caller: Caller, unread: bool = False) -> HttpSession | None:
        """The session, if it exists and `caller` is who opened it: another principal gets the same None as
        for an id that does not exist, so nothing tells it whose the session is. (`unread`: it is never read.)"""
        session = self._sessions.get(session_id)
        return session if session is not None and session.owner.principal == caller.principal else None

    def held(self, session_id: str) -> HttpSession | None:
        return self._sessions.get(session_id)

    async def pop(self, session: HttpSession) -> None:
        if self._sessions.pop(session.id, None) is not None:
            await self._limit.release(session.owner)
        session_forget(session.owner)

    async def expired(self) -> AsyncIterator[HttpSession]:
        """The sessions unused for GATEWAY_SESSION_IDLE_SECONDS, forgotten as they are returned."""
        now = time.monotonic()
        for session in [s for s in self._sessions.values() if not s.busy and s.seen + self._idle < now]:
            del self._sessions[session.id]
            await self._limit.release(session.owner)
            session_forget(session.owner)
            yield session
