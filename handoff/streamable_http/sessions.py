"""2025-11-25 sessions over HTTP: who opened each (only they may use it), its MCP-layer state, its streams
(each request's answered as SSE, and the session's own for what is sent outside any request, which a GET
reads), and whether it is in use. `LocalSessions` keeps them in this process: the embedded default's store."""

import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from mcp import types

from handoff.mcp.caller import Caller
from handoff.mcp.frames import encode_message
from handoff.mcp.handle import McpSession
from handoff.streamable_http.streams import EventStream, ReplayBuffer


@dataclass(eq=False)
class HttpSession:
    owner: Caller  # with the session's id
    replay: ReplayBuffer
    version: str = ""  # the protocol version the handshake settled on
    listening: bool = False  # a GET reads the session's own stream
    busy: int = 0  # requests running, and open streams
    seen: float = field(default_factory=time.monotonic)
    streams: dict[str, EventStream] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.mcp = McpSession(self._push, id=self.id)
        self._numbers = itertools.count()
        self.own = self.stream()
        self.resumable(self.own)

    @property
    def id(self) -> str:
        return self.owner.session_id

    def stream(self) -> EventStream:
        return EventStream(f"{self.id[:8]}-{next(self._numbers)}", self.replay)

    def resumable(self, stream: EventStream) -> None:
        """Keep `stream` for a client that resumes it (it is being answered as SSE)."""
        for old in [key for key, kept in self.streams.items() if kept.done and kept.missed(0) >= kept.count]:
            del self.streams[old]  # ended, and every event of it gone: nothing to resume
        stream.keep()
        self.streams[stream.id] = stream

    def find(self, event_id: str) -> tuple[EventStream, int] | None:
        """The stream of this session an event id (a client's `Last-Event-ID`) names, and its number."""
        stream_id, _, number = event_id.rpartition(":")
        stream = self.streams.get(stream_id)
        return (stream, int(number)) if stream is not None and number.isdigit() else None

    def touch(self) -> None:
        self.seen = time.monotonic()

    async def _push(self, message: types.JSONRPCMessage) -> None:
        if (data := encode_message(message)) is not None:
            self.own.put(data)

    async def close(self) -> None:
        await self.mcp.close()
        for stream in self.streams.values():
            stream.close()
            stream.drop_through(stream.count)


class LocalSessions:
    def __init__(self, capacity: int, idle_seconds: float, replay_events: int) -> None:
        self._sessions: dict[str, HttpSession] = {}
        self._capacity = capacity
        self._idle = idle_seconds
        self._replay = ReplayBuffer(replay_events)

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, caller: Caller) -> HttpSession | None:
        """A new session for `caller`, or None when the process holds as many as it may."""
        if len(self._sessions) >= self._capacity:
            return None
        session = HttpSession(replace(caller, session_id=uuid.uuid4().hex), self._replay)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str, caller: Caller) -> HttpSession | None:
        """The session, if it exists and `caller` is who opened it: another principal gets the same None as
        for an id that does not exist, so nothing tells it whose the session is."""
        session = self._sessions.get(session_id)
        return session if session is not None and session.owner.principal == caller.principal else None

    def pop(self, session_id: str) -> HttpSession | None:
        return self._sessions.pop(session_id, None)

    def expired(self) -> Iterator[HttpSession]:
        """The sessions unused for GATEWAY_SESSION_IDLE_SECONDS, forgotten as they are returned."""
        now = time.monotonic()
        for session in [s for s in self._sessions.values() if not s.busy and s.seen + self._idle < now]:
            del self._sessions[session.id]
            yield session
