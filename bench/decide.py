"""The cost of a call's decision, per call, in microseconds:

- policy_decide: the pure function over a compiled policy, uncached, with 0, 10 and 100 rules (the tool
  matched only by the last rule, the worst case);
- snapshot decide: what the hot path pays, the same decision memoised per snapshot;
- admission: the shared-state checks (isolation, breaker, limits) taken and given back, in Redis (one Lua
  script each way over loopback) and in the embedded default's memory; in Redis without and with the agent's
  team's limits (and with a borrowed upstream's share besides), their repeats interleaved in the same run.

    bench/run decide     # or .venv/bin/python bench/decide.py (REDIS_URL defaults to db 14)
"""

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")

import django  # noqa: E402

django.setup()

from gateway_project.lib.redis_clients import async_redis  # noqa: E402
from handoff.snapshot import Snapshot  # noqa: E402
from handoff.snapshot_tools import Route, ToolEntry  # noqa: E402
from policy.decisions import CompiledRule, Policy, Target, policy_decide  # noqa: E402
from policy.limits.admission import Admission, AgentLimits, TeamLimits, UpstreamLimits  # noqa: E402
from policy.limits.stores import LocalLimitStore, RedisLimitStore  # noqa: E402

REPEATS = 5
TARGET = Target("files__read_file", "files", True, True, upstream_id=7, server_group_id=3, tool="read_file")


def rules(count: int) -> Policy:
    """`count` rules, none of which matches but the last (an allow for this very tool)."""
    misses = [
        CompiledRule.build(
            allow=False,
            agents=frozenset({i + 100}),
            upstream_id=i + 100,
            server_group_id=None,
            tool_pattern=f"tool_{i}_*",
        )  # fmt: skip
        for i in range(count - 1)
    ]
    hit = CompiledRule.build(allow=True, agents=None, upstream_id=7, server_group_id=None, tool_pattern="read_*")
    return Policy(rules=tuple(misses + [hit] if count else []), default_allow=False)


def per_call_us(action: Callable[[], object], calls: int) -> float:
    """The median over REPEATS runs of the mean time per call."""
    runs = []
    for _ in range(REPEATS):
        started = time.perf_counter_ns()
        for _ in range(calls):
            action()
        runs.append((time.perf_counter_ns() - started) / calls / 1000)
    return statistics.median(runs)


# High limits: the benchmark measures admission, it must never trip it.
UNLIMITED_AGENT = AgentLimits(calls_per_minute=10**9, max_calls_per_session=10**9)
FILES = UpstreamLimits(
    id=999_999, slug="files", strict_group=3, group_name="g", calls_per_minute=10**9, max_concurrent=10**6,
    breaker_failures=5, breaker_recovery=30.0, probe_seconds=55.0, team=999_998,
)  # fmt: skip
OWNER = TeamLimits(id=999_998, slug="bench", calls_per_minute=10**9, max_concurrent=10**6, daily_calls=10**9)
TEAMED_AGENT = replace(UNLIMITED_AGENT, team=OWNER)
BORROWING_AGENT = replace(UNLIMITED_AGENT, team=replace(OWNER, id=999_997, slug="borrower"))


def snapshot() -> Snapshot:
    route = Route(7, "files", 1, 30.0, "read_file", FILES)
    entry = ToolEntry(route, TARGET, {"name": TARGET.exposed_name})
    return Snapshot(version=1, agents={1: UNLIMITED_AGENT}, tools={TARGET.exposed_name: entry}, policy=rules(100))


def admission(i: int, agent: AgentLimits = UNLIMITED_AGENT) -> Admission:
    return Admission(f"bench-{i}", "bench-session", 1, agent, FILES)


async def ping_us(calls: int) -> float:
    client = async_redis()
    runs = []
    for _ in range(REPEATS):
        started = time.perf_counter_ns()
        for _ in range(calls):
            await client.ping()
        runs.append((time.perf_counter_ns() - started) / calls / 1000)
    return statistics.median(runs)


async def admission_us(store, calls: int, agents: tuple[AgentLimits, ...] = (UNLIMITED_AGENT,)) -> list[float]:
    """Per agent's limits, the median over REPEATS runs; each repeat times every one in turn, so that what the
    machine does meanwhile falls on all of them alike."""
    runs: list[list[float]] = [[] for _ in agents]
    for repeat in range(REPEATS):
        for k, agent in enumerate(agents):
            started = time.perf_counter_ns()
            for i in range(calls):
                a = admission((repeat * len(agents) + k) * calls + i, agent)
                verdict = await store.admit(a)
                await store.release(a, "ok", verdict.probing)
            runs[k].append((time.perf_counter_ns() - started) / calls / 1000)
    return [statistics.median(r) for r in runs]


def main() -> None:
    print("| what | µs per call |")
    print("|---|---:|")
    for count in (0, 10, 100):
        policy = rules(count)
        us = per_call_us(
            lambda p=policy: policy_decide(policy=p, agent_id=1, agent_enabled=True, target=TARGET), 20_000
        )
        print(f"| policy_decide, {count} rules, uncached | {us:.2f} |")
    snap = snapshot()
    us = per_call_us(lambda: snap.decide(1, TARGET.exposed_name), 100_000)
    print(f"| snapshot decide (memoised, 100 rules) | {us:.2f} |")
    redis_store = RedisLimitStore()
    print(f"| baseline: one Redis PING from the same client | {asyncio.run(ping_us(2_000)):.1f} |")
    kinds = (UNLIMITED_AGENT, TEAMED_AGENT, BORROWING_AGENT)
    alone, teamed, borrowing = asyncio.run(admission_us(redis_store, 2_000, kinds))
    print(f"| admission in Redis (admit + release), no team limits | {alone:.1f} |")
    print(f"| admission in Redis, with the team's limits | {teamed:.1f} ({teamed - alone:+.1f}) |")
    print(f"| admission in Redis, team's limits, borrowed share | {borrowing:.1f} ({borrowing - alone:+.1f}) |")
    [local] = asyncio.run(admission_us(LocalLimitStore(), 20_000))
    print(f"| admission in memory (admit + release) | {local:.1f} |")


if __name__ == "__main__":
    main()
