"""2025-11-25 sessions in Redis, so that any web process serves any request of any session, and a plain
round-robin load balancer needs no affinity (docs/internals.md).

A session's record (who opened it, what its handshake settled, its log level) is one key, signed so that a
writer to Redis can neither make one nor change whose it is, and renewed on every request (a GETEX, which
also tells a process that the session ended elsewhere, in one script with the read of the session's handoff
entry, which the request's caller stage takes; a tools/call on a session held here skips it, its admission
checking the two instead: handoff/mcp/unverified.py). Each process keeps the sessions it served lately as
objects and takes up one it never saw from its record. What a session is sent outside any request goes into
a Redis stream, which the GET holding it reads wherever each side runs; a request's stream answered as SSE is
copied there too, for a client that resumes it on another process. A client's answer to a question, or its
cancellation of a request, that reaches a process other than the one waiting for it is passed on over the
channel layer (handoff/mcp/list_changed.py's relay)."""

import asyncio
import logging
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import Any

from django.conf import settings
from django.core import signing
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_REQUEST

from gateway_project.lib import redis_clients
from gateway_project.lib.redis_clients import async_redis, script_run
from handoff.endpoints.streamable_http.sessions import NOT_FOUND, HttpSession, Readable
from handoff.endpoints.streamable_http.streams import EventStream
from handoff.endpoints.streamable_http.wire import PING, sse_frame
from handoff.mcp.agent_relay import session_level, session_level_restore
from handoff.mcp.caller import Caller
from handoff.mcp.list_changed import session_forget
from handoff.mcp.unverified import Unverified, unverified_hold
from handoff.protocol.tunnels import RedisSessionIndex, SessionStateUnavailable, index_read_ahead, index_session
from handoff.session_limit import RedisSessionLimit

logger = logging.getLogger(__name__)
SALT = "switchboard.mcp-session"
# An ended session's id is remembered so that its end is recorded once: until every process that held it has
# swept it (its idle time, then its reaper's next sweep, a minute at most), and no longer: a mark that outlived
# that (an hour, before) would be a key per ended session left in Redis well after its session.
SWEPT_WITHIN = 60
# One number per event of a session's own stream, whichever process adds it: the stream's entry ids are
# "<number>-1", so a reader resumes from a number and the replay bound trims by count.
PUSH = """
local n = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[2], n .. '-1', 'd', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[3])
return n
"""
# A request's session record, renewed, and its session's handoff entry (handoff/protocol/tunnels.py): one round trip.
READ = "return {redis.call('GETEX', KEYS[1], 'EX', ARGV[1]), redis.call('GET', KEYS[2])}"
# The end of a session noticed by the first process to see its record gone: only that one records it.
CLAIM_END = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('SET', KEYS[2], 1, 'NX', 'EX', ARGV[1]) then return 1 end
return 0
"""


def _key(*parts: str) -> str:
    return settings.GATEWAY_REDIS_PREFIX + ":".join(parts)


class RedisStream:
    """One stream's events in Redis, read from any process (`Readable`)."""

    def __init__(self, key: str, stream_id: str) -> None:
        self.key, self.id = key, stream_id

    def event_id(self, number: int) -> str:
        return f"{self.id}:{number}"

    async def missed(self, after: int) -> int:
        first = await async_redis().xrange(self.key, count=1)
        return max(0, int(first[0][0].split(b"-")[0]) - after - 1) if first else 0

    async def frames(self, after: int, idle: float) -> AsyncIterator[bytes]:
        position = f"{after}-1"
        while True:
            read = await async_redis().xread({self.key: position}, count=100, block=max(1, int(idle * 1000)))
            if not read:
                yield PING
                continue
            for entry_id, fields in read[0][1]:
                position = entry_id
                if b"end" in fields:
                    return
                number = int(entry_id.split(b"-")[0])
                yield sse_frame(fields[b"d"].decode(), self.event_id(number))


class RedisStreams:
    """A session's streams in Redis (`Streams`)."""

    def __init__(self, session_id: str, ttl: int, replay_events: int) -> None:
        self._session, self._prefix = session_id, session_id[:8]
        self._ttl, self._bound = ttl, replay_events
        self._own = RedisStream(_key("mcp-stream", session_id, "own"), f"{self._prefix}-own")
        self._copies: set[asyncio.Task] = set()

    def stream(self) -> EventStream:
        return EventStream(f"{self._prefix}-{secrets.token_hex(4)}")

    def resumable(self, stream: EventStream) -> None:
        copy = asyncio.create_task(self._copy(stream))
        self._copies.add(copy)
        copy.add_done_callback(self._copies.discard)

    async def _copy(self, stream: EventStream) -> None:
        key = self._stream_key(stream.id)
        redis = async_redis()
        async for event in stream.events(0):
            if event is not None:
                await redis.xadd(key, {"d": event.data}, id=f"{event.number}-1", maxlen=self._bound, approximate=False)
        async with redis.pipeline(transaction=False) as pipe:
            pipe.xadd(key, {"end": 1}, id=f"{stream.count}-2")
            pipe.expire(key, self._ttl)
            await pipe.execute()

    def _stream_key(self, stream_id: str) -> str:
        return _key("mcp-stream", self._session, stream_id.removeprefix(f"{self._prefix}-"))

    async def push(self, data: str) -> None:
        counter = self._own.key + ":n"
        await async_redis().eval(PUSH, 2, self._own.key, counter, data, self._bound, self._ttl)

    async def reader(self, event_id: str | None) -> tuple[Readable, int, bool] | None:
        redis = async_redis()
        if event_id is None:
            return self._own, int(await redis.get(self._own.key + ":n") or 0), True
        stream_id, _, number = event_id.rpartition(":")
        if not (number.isdigit() and stream_id.startswith(f"{self._prefix}-")):
            return None
        if stream_id == self._own.id:
            return self._own, int(number), True
        suffix = stream_id.removeprefix(f"{self._prefix}-")
        if len(suffix) != 8 or any(c not in "0123456789abcdef" for c in suffix):
            return None
        key = self._stream_key(stream_id)
        return (RedisStream(key, stream_id), int(number), False) if await redis.exists(key) else None

    async def close(self) -> None:
        """The session ended: a GET reading its own stream, here or anywhere, ends too."""
        async with async_redis().pipeline(transaction=False) as pipe:
            pipe.xadd(self._own.key, {"end": 1}, id="*")
            pipe.expire(self._own.key, 60)
            await pipe.execute()


class RedisSessions:
    def __init__(self, capacity: int, limit: RedisSessionLimit, idle_seconds: float, replay_events: int) -> None:
        # The session, its record and its handoff entry as last read.
        self._cache: OrderedDict[str, tuple[HttpSession, bytes, bytes | None]] = OrderedDict()
        self._capacity, self._limit = capacity, limit
        self._ttl = max(1, math.ceil(idle_seconds))
        self._ended = self._ttl + SWEPT_WITHIN
        self._idle = idle_seconds
        self._bound = replay_events

    def __len__(self) -> int:
        return len(self._cache)

    def _new(self, owner: Caller) -> HttpSession:
        return HttpSession(owner, RedisStreams(owner.session_id, self._ttl, self._bound))

    def _keep(self, session: HttpSession, record: bytes, entry: bytes | None = None) -> None:
        self._cache[session.id] = (session, record, entry)
        self._cache.move_to_end(session.id)
        while len(self._cache) > self._capacity:
            _, (evicted, _, _) = self._cache.popitem(last=False)  # its record stays: taken up if it comes back here
            session_forget(evicted.owner)

    async def open(self, caller: Caller) -> HttpSession:
        """A new session for `caller`; SessionsFull when its principal opened as many as it may."""
        owner = replace(caller, session_id=secrets.token_hex(16), token="")
        await self._limit.admit(owner)
        session = self._new(owner)
        self._keep(session, b"")  # its record is written once the handshake settles (`save`)
        return session

    async def save(self, session: HttpSession) -> None:
        fields = {
            "owner": session.owner.wire(),
            "version": session.version,
            "handshake": session.mcp.handshake(),
            "level": session_level(session.owner),
        }
        record = signing.dumps(fields, salt=SALT, compress=True).encode()
        await async_redis().set(_key("mcp-session", session.id), record, ex=self._ttl)
        held = self._cache.get(session.id)
        self._keep(session, record, held[2] if held else None)

    async def get(self, session_id: str, caller: Caller, unread: bool = False) -> HttpSession | None:
        """The session, its record renewed, or None (ended, unknown, another principal's). `unread`: for a
        tools/call, whose admission checks the session's state (handoff/mcp/unverified.py), a session held
        here is taken as last read, without a round trip."""
        if len(session_id) != 32 or any(c not in "0123456789abcdef" for c in session_id):
            return None
        index = index_session(caller.agent_id, session_id)  # the caller stage's look at the session's handoff
        keys = [_key("mcp-session", session_id), RedisSessionIndex.key(index)]
        held = self._cache.get(session_id)  # its record is b"" until the handshake settles: not taken unread
        if unread and held and held[1] and not held[0].ended and held[0].owner.principal == caller.principal:
            session, record, entry = held
            index_read_ahead(index, entry)
            reread = partial(self._reread, session, index)
            unverified_hold(Unverified(keys[0], record, keys[1], entry, self._ttl, reread))
            self._cache.move_to_end(session_id)
            return session
        session, _, _ = await self._read(session_id, index, keys)
        return session if session is not None and session.owner.principal == caller.principal else None

    async def _read(
        self, session_id: str, index: str, keys: list[str]
    ) -> tuple[HttpSession | None, bytes | None, bytes | None]:
        """The session's record, renewed, and its handoff entry (left for the caller stage), as one script; the
        session they make, kept with them (None: the record is gone or does not verify)."""
        record, entry = await script_run(READ, keys, [self._ttl])
        index_read_ahead(index, entry)
        return self._taken(session_id, record, entry), record, entry

    def _taken(self, session_id: str, record: bytes | None, entry: bytes | None) -> HttpSession | None:
        """The session of the record as read, kept with it (None: the record is gone or does not verify)."""
        if record is None:
            return None
        cached = self._cache.get(session_id)
        if cached is not None and cached[1] == record:
            session = cached[0]
        elif (session := self._take_up(session_id, record, cached[0] if cached else None)) is None:
            return None
        self._keep(session, record, entry)
        return session

    async def _reread(self, session: HttpSession, index: str, last: Unverified) -> bool:
        """For a call that ran on the session's state as `last` read: Unverified.reread."""
        try:
            taken, record, entry = await self._read(session.id, index, [last.record_key, last.entry_key])
        except redis_clients.RedisError as exc:
            raise SessionStateUnavailable(str(exc)) from exc
        if taken is None:
            session.ended = True
            raise MCPError(INVALID_REQUEST, NOT_FOUND)
        return (record, entry) != (last.record, last.entry)

    def _take_up(self, session_id: str, record: bytes, known: HttpSession | None) -> HttpSession | None:
        """The session of a record this process has not seen in this form: another process opened it, or
        changed what it holds (a log level)."""
        try:
            fields: dict[str, Any] = signing.loads(record.decode(), salt=SALT)
        except (signing.BadSignature, UnicodeDecodeError):
            logger.warning("the record of session %s… in Redis does not verify: refused", session_id[:8])
            return None
        session = known or self._new(Caller.from_wire(fields["owner"]))
        session.version = fields["version"]
        if known is None or fields["handshake"] != known.mcp.handshake():
            session.mcp.resume(fields["handshake"])
        session_level_restore(session.owner, fields["level"])
        return session

    def held(self, session_id: str) -> HttpSession | None:
        """The session, if this process holds it now (no look at Redis)."""
        cached = self._cache.get(session_id)
        return cached[0] if cached else None

    async def pop(self, session: HttpSession) -> None:
        async with async_redis().pipeline(transaction=False) as pipe:
            pipe.delete(_key("mcp-session", session.id))
            pipe.set(_key("mcp-ended", session.id), 1, ex=self._ended)
            await pipe.execute()
        await self._limit.release(session.owner)
        self._cache.pop(session.id, None)
        session_forget(session.owner)

    async def expired(self) -> AsyncIterator[HttpSession]:
        """The sessions held here that ended for want of use; those another process still serves are only
        forgotten here, and one still in use here keeps its record alive."""
        now = time.monotonic()
        redis = async_redis()
        for session_id, (session, _, _) in list(self._cache.items()):
            if session.busy:
                await redis.expire(_key("mcp-session", session_id), self._ttl)
            elif session.seen + self._idle < now:
                del self._cache[session_id]
                session_forget(session.owner)
                ended = _key("mcp-ended", session_id)
                if await redis.eval(CLAIM_END, 2, _key("mcp-session", session_id), ended, self._ended):
                    yield session
