"""The two homes of admission state (policy/limits/admission.py): Redis, shared by every process, and this
process's memory for the single-process embedded default. Each check runs in this order and an admitted call
takes its share of every limit at once, so a refused call counts against nothing."""

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from functools import cache

from django.conf import settings

from gateway_project.lib import redis_clients
from policy.limits.admission import (
    LIMITS_UNAVAILABLE,
    WINDOW_SECONDS,
    Admission,
    BreakerStatus,
    Health,
    LimitStore,
    TeamLimits,
    Verdict,
)

logger = logging.getLogger(__name__)
SWEEP_SECONDS = 10.0
DAY_SECONDS = 86_400  # a team's daily budget runs from 00:00 to 24:00 UTC

# KEYS: group lock, session calls, agent window, upstream window, upstream busy, breaker, team window, team busy,
#       team day, share busy (the borrowing team's calls at once on this upstream).
# ARGV: strict group ('' if none), session ttl, session max, agent rate, upstream rate, max concurrent,
#       request id, busy ttl, probe seconds, window seconds, stateless ('1': the ttl is a fixed window),
#       team ('1' if the agent has one), team rate, team max concurrent, team daily calls, share (0: not borrowed),
#       then the expected keys' count and, for each (KEYS 11 on), its value ('' for absent) and seconds to renew it.
ADMIT = """
for i = 1, tonumber(ARGV[17]) do
  local key, seconds = KEYS[10 + i], tonumber(ARGV[17 + 2 * i])
  local value
  if seconds > 0 then value = redis.call('GETEX', key, 'EX', seconds) else value = redis.call('GET', key) end
  if (value or '') ~= ARGV[16 + 2 * i] then return {'STATE_CHANGED', '0', '0'} end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local group, ttl, window, fixed = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[10]), ARGV[11] == '1'
local team, share = ARGV[12] == '1', tonumber(ARGV[16])
local DAY = DAY_SECONDS
local function left(key)
  if not fixed then return '0' end
  return tostring(math.max(redis.call('PTTL', key), 0) / 1000)
end
local function hold(key)
  redis.call('INCR', key)
  if redis.call('TTL', key) < tonumber(ARGV[8]) then redis.call('EXPIRE', key, ARGV[8]) end
end
if group ~= '' then
  local held = redis.call('GET', KEYS[1])
  if held and held ~= group then return {'POLICY_GROUP_ISOLATION', left(KEYS[1]), '0'} end
end
local probing = '0'
local open_until = tonumber(redis.call('HGET', KEYS[6], 'open_until') or '0')
if open_until > 0 then
  if now < open_until then return {'UPSTREAM_CIRCUIT_OPEN', tostring(open_until - now), '0'} end
  local probe_until = tonumber(redis.call('HGET', KEYS[6], 'probe_until') or '0')
  if now < probe_until then return {'UPSTREAM_CIRCUIT_OPEN', tostring(probe_until - now), '0'} end
  probing = '1'
end
if tonumber(redis.call('GET', KEYS[2]) or '0') >= tonumber(ARGV[3]) then
  return {fixed and 'KEY_CALL_LIMIT' or 'SESSION_CALL_LIMIT', left(KEYS[2]), '0'}
end
local day, today = math.floor(now / DAY), {}
if team then
  today = redis.call('HMGET', KEYS[9], 'day', 'calls')
  if tonumber(today[1]) == day and tonumber(today[2]) >= tonumber(ARGV[15]) then
    return {'TEAM_DAILY_BUDGET', tostring((day + 1) * DAY - now), '0'}
  end
end
local windows = {{KEYS[3], tonumber(ARGV[4]), 'AGENT_RATE_LIMITED'}}
if team then windows[#windows + 1] = {KEYS[7], tonumber(ARGV[13]), 'TEAM_RATE_LIMITED'} end
windows[#windows + 1] = {KEYS[4], tonumber(ARGV[5]), 'UPSTREAM_RATE_LIMITED'}
for _, w in ipairs(windows) do
  redis.call('ZREMRANGEBYSCORE', w[1], '-inf', now - window)
  if redis.call('ZCARD', w[1]) >= w[2] then
    local oldest = redis.call('ZRANGE', w[1], 0, 0, 'WITHSCORES')
    return {w[3], tostring(tonumber(oldest[2]) + window - now), '0'}
  end
end
if tonumber(redis.call('GET', KEYS[5]) or '0') >= tonumber(ARGV[6]) then return {'UPSTREAM_BUSY', '1', '0'} end
if team and tonumber(redis.call('GET', KEYS[8]) or '0') >= tonumber(ARGV[14]) then return {'TEAM_BUSY', '1', '0'} end
if share > 0 and tonumber(redis.call('GET', KEYS[10]) or '0') >= share then
  return {'UPSTREAM_SHARE_BUSY', '1', '0'}
end
if fixed then
  if group ~= '' then redis.call('SET', KEYS[1], group, 'EX', ttl, 'NX') end
  if redis.call('INCR', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ttl) end
else
  if group ~= '' then redis.call('SET', KEYS[1], group, 'EX', ttl) else redis.call('EXPIRE', KEYS[1], ttl) end
  redis.call('INCR', KEYS[2])
  redis.call('EXPIRE', KEYS[2], ttl)
end
for _, w in ipairs(windows) do
  redis.call('ZADD', w[1], now, ARGV[7])
  redis.call('EXPIRE', w[1], window + 1)
end
redis.call('INCR', KEYS[5])
redis.call('EXPIRE', KEYS[5], ARGV[8])
if team then
  -- A team's calls run on upstreams of different timeouts: its counters' expiry only ever grows.
  hold(KEYS[8])
  if tonumber(today[1]) == day then redis.call('HINCRBY', KEYS[9], 'calls', 1)
  else redis.call('HSET', KEYS[9], 'day', day, 'calls', 1) end
  redis.call('EXPIRE', KEYS[9], math.ceil((day + 1) * DAY - now) + 1)
end
if share > 0 then hold(KEYS[10]) end
if probing == '1' then redis.call('HSET', KEYS[6], 'probe_until', now + tonumber(ARGV[9])) end
return {'', '0', probing}
""".replace("DAY_SECONDS", str(DAY_SECONDS))

# KEYS: upstream busy, breaker, team busy, share busy. ARGV: health, failures that open, recovery seconds,
# probing, first open seconds, team ('1': give the team's slot back too), share ('1': and the borrowed one).
# A circuit opens for the first open seconds, and each failed probe doubles that up to the recovery seconds.
RELEASE = """
local function give(key)
  if redis.call('DECR', key) < 0 then redis.call('SET', key, 0) end
end
give(KEYS[1])
if ARGV[6] == '1' then give(KEYS[3]) end
if ARGV[7] == '1' then give(KEYS[4]) end
local health, probing = ARGV[1], ARGV[4] == '1'
if health == 'ok' then
  redis.call('DEL', KEYS[2])
elseif health == 'fail' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  local failures = redis.call('HINCRBY', KEYS[2], 'failures', 1)
  local open = redis.call('HEXISTS', KEYS[2], 'open_until') == 1
  if probing or (not open and failures >= tonumber(ARGV[2])) then
    local last = tonumber(redis.call('HGET', KEYS[2], 'open_for') or '0')
    local open_for = math.min(probing and last > 0 and last * 2 or tonumber(ARGV[5]), tonumber(ARGV[3]))
    redis.call('HSET', KEYS[2], 'open_until', now + open_for, 'open_for', open_for)
    redis.call('HDEL', KEYS[2], 'probe_until')
  end
elseif probing then
  redis.call('HDEL', KEYS[2], 'probe_until')
end
"""


def _status(failures: int, open_until: float, now: float) -> BreakerStatus:
    if not open_until:
        return BreakerStatus("closed", failures, 0.0)
    if now < open_until:
        return BreakerStatus("open", failures, open_until - now)
    return BreakerStatus("half-open", failures, 0.0)


class RedisLimitStore:
    def __init__(self) -> None:
        self.prefix = settings.GATEWAY_REDIS_PREFIX

    def _breaker_key(self, upstream_id: int) -> str:
        return f"{self.prefix}breaker:{upstream_id}"

    async def admit(self, a: Admission) -> Verdict:
        p = self.prefix
        keys = [
            f"{p}lock:{a.session}",
            f"{p}calls:{a.session}",
            f"{p}rate:agent:{a.rate_key}",
            f"{p}rate:upstream:{a.upstream.id}",
            f"{p}busy:{a.upstream.id}",
            self._breaker_key(a.upstream.id),
            *self._team_keys(a),
            *(key for key, _, _ in a.expected),
        ]
        team = a.agent.team
        args = [
            "" if a.upstream.strict_group is None else str(a.upstream.strict_group),
            max(1, int(a.term)),
            a.agent.max_calls_per_session,
            a.agent.calls_per_minute,
            a.upstream.calls_per_minute,
            a.upstream.max_concurrent,
            a.request_id,
            int(a.upstream.probe_seconds) + 1,
            a.upstream.probe_seconds,
            WINDOW_SECONDS,
            "1" if a.stateless else "0",
            "1" if team else "0",
            team.calls_per_minute if team else 0,
            team.max_concurrent if team else 0,
            team.daily_calls if team else 0,
            a.upstream.share if a.borrowed else 0,
            len(a.expected),
        ]
        for _, value, seconds in a.expected:
            args += (value or b"", seconds)
        try:
            code, retry_after, probing = await redis_clients.script_run(ADMIT, keys, args)
        except redis_clients.RedisError:
            logger.exception("admission state unavailable")
            return Verdict(LIMITS_UNAVAILABLE, 1.0)
        return Verdict(code.decode(), float(retry_after), probing == b"1")

    def _team_keys(self, a: Admission) -> list[str]:
        """The team's window, calls at once and day, and its calls at once on a borrowed upstream."""
        p, team = self.prefix, a.agent.team.id if a.agent.team else 0
        return [
            f"{p}rate:team:{team}",
            f"{p}busy:team:{team}",
            f"{p}day:team:{team}",
            f"{p}busy:share:{a.upstream.id}:{team}",
        ]

    async def release(self, a: Admission, health: Health, probing: bool) -> None:
        _, team_busy, _, share_busy = self._team_keys(a)
        keys = [f"{self.prefix}busy:{a.upstream.id}", self._breaker_key(a.upstream.id), team_busy, share_busy]
        args = [
            health,
            a.upstream.breaker_failures,
            a.upstream.breaker_recovery,
            "1" if probing else "0",
            settings.GATEWAY_BREAKER_FIRST_OPEN_SECONDS,
            "1" if a.agent.team else "0",
            "1" if a.borrowed else "0",
        ]
        try:
            await redis_clients.script_run(RELEASE, keys, args)
        except redis_clients.RedisError:  # the busy counter expires on its own; the breaker misses one reading
            logger.exception("could not release admission of request %s", a.request_id)

    def breaker(self, upstream_id: int) -> BreakerStatus:
        with redis_clients.sync_redis().pipeline(transaction=False) as pipe:
            pipe.hmget(self._breaker_key(upstream_id), ["failures", "open_until"])
            pipe.time()
            (failures, open_until), (seconds, micros) = pipe.execute()
        return _status(int(failures or 0), float(open_until or 0), seconds + micros / 1e6)

    def breaker_reset(self, upstream_id: int) -> None:
        redis_clients.sync_redis().delete(self._breaker_key(upstream_id))


@dataclass
class _Breaker:
    failures: int = 0
    open_until: float = 0.0
    probe_until: float = 0.0
    open_for: float = 0.0  # how long it last opened for


@dataclass
class LocalLimitStore:
    """The same rules for one process; entries of idle sessions are dropped as they expire."""

    locks: dict[str, tuple[int, float]] = field(default_factory=dict)  # session -> (group, expiry)
    calls: dict[str, tuple[int, float]] = field(default_factory=dict)  # session -> (count, expiry)
    windows: dict[str, deque[float]] = field(default_factory=dict)
    busy: dict[int, int] = field(default_factory=dict)
    team_busy: dict[str, int] = field(default_factory=dict)  # "team:{id}", "share:{upstream}:{team}" -> at once
    days: dict[int, tuple[int, int]] = field(default_factory=dict)  # team -> (UTC day, its calls)
    breakers: dict[int, _Breaker] = field(default_factory=dict)
    swept_at: float = 0.0

    async def admit(self, a: Admission) -> Verdict:
        now = time.time()
        if now - self.swept_at > SWEEP_SECONDS:
            self._expire(now)
        held = self.locks.get(a.session)
        held = held if held and held[1] > now else None
        if a.upstream.strict_group is not None and held and held[0] != a.upstream.strict_group:
            return Verdict("POLICY_GROUP_ISOLATION", held[1] - now if a.stateless else 0.0)
        breaker = self.breakers.get(a.upstream.id, _Breaker())
        if breaker.open_until and now < max(breaker.open_until, breaker.probe_until):
            return Verdict("UPSTREAM_CIRCUIT_OPEN", max(breaker.open_until, breaker.probe_until) - now)
        count, expiry = self.calls.get(a.session, (0, 0.0))
        count = count if expiry > now else 0
        if count >= a.agent.max_calls_per_session:
            return Verdict("KEY_CALL_LIMIT", expiry - now) if a.stateless else Verdict("SESSION_CALL_LIMIT")
        team, day = a.agent.team, int(now // DAY_SECONDS)
        spent = self._spent(team, day)
        if team and spent >= team.daily_calls:
            return Verdict("TEAM_DAILY_BUDGET", (day + 1) * DAY_SECONDS - now)
        windows = [(f"agent:{a.rate_key}", a.agent.calls_per_minute, "AGENT_RATE_LIMITED")]
        if team:
            windows.append((f"team:{team.id}", team.calls_per_minute, "TEAM_RATE_LIMITED"))
        windows.append((f"upstream:{a.upstream.id}", a.upstream.calls_per_minute, "UPSTREAM_RATE_LIMITED"))
        for key, limit, code in windows:
            window = self.windows.setdefault(key, deque())
            while window and window[0] <= now - WINDOW_SECONDS:
                window.popleft()
            if len(window) >= limit:
                return Verdict(code, window[0] + WINDOW_SECONDS - now)
        if refused := self._busy(a):
            return Verdict(refused, 1.0)
        renewed = now + a.term
        if a.upstream.strict_group is not None and not (a.stateless and held):
            self.locks[a.session] = (a.upstream.strict_group, renewed)
        elif held and not a.stateless:
            self.locks[a.session] = (held[0], renewed)
        # A stateless key's window is fixed from its first call: later calls never extend it.
        self.calls[a.session] = (count + 1, expiry if a.stateless and count else renewed)
        for key, _, _ in windows:
            self.windows[key].append(now)
        self.busy[a.upstream.id] = self.busy.get(a.upstream.id, 0) + 1
        if team:
            self.days[team.id] = (day, spent + 1)
        for key in self._team_slots(a):
            self.team_busy[key] = self.team_busy.get(key, 0) + 1
        probing = bool(breaker.open_until)
        if probing:
            breaker.probe_until = now + a.upstream.probe_seconds
            self.breakers[a.upstream.id] = breaker
        return Verdict("", 0.0, probing)

    def _spent(self, team: TeamLimits | None, day: int) -> int:
        """The team's calls on this UTC day: an earlier day's count is over."""
        if team is None:
            return 0
        counted_on, calls = self.days.get(team.id, (day, 0))
        return calls if counted_on == day else 0

    def _busy(self, a: Admission) -> str:
        """Which count of calls at once is full ("" if none): the upstream's, the team's, the borrowed share."""
        if self.busy.get(a.upstream.id, 0) >= a.upstream.max_concurrent:
            return "UPSTREAM_BUSY"
        team = a.agent.team
        if team and self.team_busy.get(f"team:{team.id}", 0) >= team.max_concurrent:
            return "TEAM_BUSY"
        if team and a.borrowed and self.team_busy.get(f"share:{a.upstream.id}:{team.id}", 0) >= a.upstream.share:
            return "UPSTREAM_SHARE_BUSY"
        return ""

    @staticmethod
    def _team_slots(a: Admission) -> list[str]:
        team = a.agent.team
        if team is None:
            return []
        return [f"team:{team.id}", *([f"share:{a.upstream.id}:{team.id}"] if a.borrowed else [])]

    async def release(self, a: Admission, health: Health, probing: bool) -> None:
        self.busy[a.upstream.id] = max(0, self.busy.get(a.upstream.id, 0) - 1)
        for key in self._team_slots(a):
            self.team_busy[key] = max(0, self.team_busy.get(key, 0) - 1)
        breaker = self.breakers.setdefault(a.upstream.id, _Breaker())
        if health == "ok":
            del self.breakers[a.upstream.id]
        elif health == "fail":
            breaker.failures += 1
            if probing or (not breaker.open_until and breaker.failures >= a.upstream.breaker_failures):
                first = settings.GATEWAY_BREAKER_FIRST_OPEN_SECONDS
                breaker.open_for = min(
                    breaker.open_for * 2 if probing and breaker.open_for else first, a.upstream.breaker_recovery
                )
                breaker.open_until, breaker.probe_until = time.time() + breaker.open_for, 0.0
        elif probing:
            breaker.probe_until = 0.0

    def breaker(self, upstream_id: int) -> BreakerStatus:
        breaker = self.breakers.get(upstream_id, _Breaker())
        return _status(breaker.failures, breaker.open_until, time.time())

    def breaker_reset(self, upstream_id: int) -> None:
        self.breakers.pop(upstream_id, None)

    def _expire(self, now: float) -> None:
        self.swept_at = now
        for table in (self.locks, self.calls):
            for session in [s for s, (_, expiry) in table.items() if expiry <= now]:
                del table[session]


@cache
def limit_store() -> LimitStore:
    return RedisLimitStore() if settings.REDIS_URL else LocalLimitStore()
