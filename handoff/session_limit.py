"""The bound on the sessions one principal (an agent, and the person when a token names one) opens, over every
transport that holds a session (2025-11-25 HTTP and `/mcp/ws`): at most GATEWAY_MAX_SESSIONS_PER_AGENT opened
within the last GATEWAY_SESSION_IDLE_SECONDS and not closed, so that one caller's flood of `initialize` or of
sockets neither fills a process nor grows Redis without end. Counted from the opening, not the last use, so that
no request pays for the count. In this process (the embedded default) or, with Redis, across every process."""

import math
import time
from collections import OrderedDict

from django.conf import settings

from gateway_project.lib.redis_clients import async_redis
from handoff.mcp.caller import Caller
from policy.identity import person_digest

# A session not served because its state could not be read or written (Redis down): retry shortly.
STATE_UNAVAILABLE = "SESSION_STATE_UNAVAILABLE"
UNAVAILABLE = (
    "The gateway cannot read this session's state right now, so the request was not served. Retry after 1 second."
)
# Opening a session for a principal: those opened before the window leave its count; the oldest's opening time
# comes back when the count is full, else the new one is counted.
OPEN = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1] - ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return false
"""


class SessionsFull(Exception):
    """No session opened: the process holds as many as it may (503), or the principal opened as many as one
    may (429, with the seconds until its oldest counted session stops counting)."""

    def __init__(self, status: int, message: str, retry_after: int, code: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after, self.code = status, message, retry_after, code


def _full(limit: int, oldest: float, idle: float) -> SessionsFull:
    """The refusal for a principal whose `limit` sessions are counted, the oldest opened at `oldest` (epoch s)."""
    retry = max(1, math.ceil(oldest + idle - time.time()))
    message = (
        f"Too many sessions: this agent opened {limit} in the last {idle:g} s (GATEWAY_MAX_SESSIONS_PER_AGENT). "
        f"Close one (DELETE /mcp, or close its WebSocket), or retry in {retry} s."
    )
    return SessionsFull(429, message, retry, "AGENT_SESSION_LIMIT")


class LocalSessionLimit:
    """The count in this process: its sessions are only here."""

    def __init__(self, limit: int, idle_seconds: float) -> None:
        self._opened: dict[tuple, OrderedDict[str, float]] = {}  # per principal: its session ids by opening time
        self._limit, self._idle = limit, idle_seconds

    async def admit(self, session: Caller) -> None:
        """Count the session (`session.session_id`, opened by its principal), or SessionsFull."""
        now = time.time()
        opened = self._opened.setdefault(session.principal, OrderedDict())
        while opened and next(iter(opened.values())) <= now - self._idle:
            opened.popitem(last=False)
        if len(opened) >= self._limit:
            raise _full(self._limit, next(iter(opened.values())), self._idle)
        opened[session.session_id] = now

    async def release(self, session: Caller) -> None:
        """The session closed: its place is free."""
        opened = self._opened.get(session.principal, {})
        opened.pop(session.session_id, None)
        if not opened:
            self._opened.pop(session.principal, None)


class RedisSessionLimit:
    """The count in Redis, for every process: a sorted set of session ids by opening time per principal."""

    def __init__(self, limit: int, idle_seconds: float) -> None:
        self._limit, self._idle = limit, idle_seconds
        self._ttl = max(1, math.ceil(idle_seconds))

    async def admit(self, session: Caller) -> None:
        key = _opened_key(session)
        oldest = await async_redis().eval(
            OPEN, 1, key, time.time(), self._idle, self._limit, session.session_id, self._ttl
        )
        if oldest is not None:
            raise _full(self._limit, float(oldest), self._idle)

    async def release(self, session: Caller) -> None:
        await async_redis().zrem(_opened_key(session), session.session_id)


def _opened_key(session: Caller) -> str:
    """Where a principal's sessions are counted; a person by digest, so that Redis holds no one's name."""
    person = person_digest(session.person_issuer, session.person_subject) if session.person_subject else ""
    return f"{settings.GATEWAY_REDIS_PREFIX}mcp-opened:{session.agent_id}:{person}"


session_limit = (RedisSessionLimit if settings.REDIS_URL else LocalSessionLimit)(
    settings.GATEWAY_MAX_SESSIONS_PER_AGENT, settings.GATEWAY_SESSION_IDLE_SECONDS
)
