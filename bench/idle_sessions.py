"""What idle 2025-11-25 sessions cost a web process and Redis (issue 22's bar: 10,000 grow each by <= 200 MiB).

One gateway under Daphne on PostgreSQL and Redis (bench/run's environment, inline executor, a bench agent key).
Sessions are opened with raw HTTP, not the SDK client (too slow for 10,000): POST initialize, then POST
notifications/initialized with the session id; no GET stream, nothing after. httpx2 keeps at most --concurrency
connections. The web process's VmRSS (/proc/<pid>/status) and Redis's used_memory (INFO memory), with the key
count and MEMORY USAGE of the bench's own Redis database (other databases of the same Redis may move under us),
are read after 20 warm-up sessions and after each checkpoint, once RSS has settled. GATEWAY_MAX_LEGACY_SESSIONS
is set above N so that the SDK evicts nothing, and the whole run must finish inside GATEWAY_SESSION_IDLE_SECONDS
(1800 s by default), which it checks.

`--attribute N` then opens N sessions on a second gateway under tracemalloc and says which code's allocations
the Python heap grew by.

    bench/run idle_sessions [--sessions 10000] [--checkpoints 1000,5000,10000] [--concurrency 50] [--attribute 2000]
"""

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx2
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.run import setup_database  # noqa: E402  (bench/run.py puts the repository on sys.path)
from bench.traced import growth_report, traced_gateway, traced_snapshot  # noqa: E402
from tests import servers  # noqa: E402

MIB = 1024 * 1024
VERSION = "2025-11-25"
ACCEPT = "application/json, text/event-stream"
WARMUP = 20  # sessions opened before the first reading, not counted
SETTLE_BOUND = 30.0  # seconds to wait for RSS to stop moving after a checkpoint


def initialize_body(number: int) -> dict:
    client = {"name": "idle-bench", "version": str(number)}
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": client},
    }


async def open_session(http: httpx2.AsyncClient, url: str, number: int) -> str:
    opened = await http.post(url, json=initialize_body(number))
    session_id = opened.headers.get("mcp-session-id")
    if opened.status_code != 200 or not session_id:
        raise RuntimeError(f"initialize answered {opened.status_code}: {opened.text[:500]}")
    headers = {"mcp-session-id": session_id, "mcp-protocol-version": VERSION}
    notified = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    if notified.status_code != 202:
        raise RuntimeError(f"notifications/initialized answered {notified.status_code}: {notified.text[:500]}")
    return session_id


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def settled_rss(pid: int) -> int:
    """RSS once two reads half a second apart differ by under 1 MiB (the server may still be finishing writes)."""
    deadline, last = time.monotonic() + SETTLE_BOUND, rss_bytes(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)  # a poll interval, bounded by SETTLE_BOUND
        now = rss_bytes(pid)
        if abs(now - last) < MIB:
            return now
        last = now
    return last


def redis_figures(client: redis.Redis) -> dict[str, int]:
    own = sum(client.memory_usage(key) or 0 for key in client.scan_iter(count=1000))
    return {"used_memory": client.info("memory")["used_memory"], "db_keys": client.dbsize(), "db_key_bytes": own}


async def open_many(url: str, key: str, first: int, count: int, concurrency: int) -> float:
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {key}", "Accept": ACCEPT}
    gate = asyncio.Semaphore(concurrency)
    started = time.perf_counter()
    async with httpx2.AsyncClient(headers=headers, limits=limits, timeout=60) as http:

        async def one(number: int) -> None:
            async with gate:
                await open_session(http, url, number)

        await asyncio.gather(*(one(number) for number in range(first, first + count)))
    return time.perf_counter() - started


def measure(url: str, key: str, pid: int, store: redis.Redis, checkpoints: list[int], concurrency: int) -> list[dict]:
    # The first requests start the process's background tasks and fill its caches: not a session's cost.
    asyncio.run(open_many(url, key, -WARMUP, WARMUP, concurrency))
    rows = [{"sessions": 0, "rss": settled_rss(pid), **redis_figures(store), "seconds": 0.0}]
    print(f"before: RSS {rows[0]['rss'] / MIB:.1f} MiB, Redis {rows[0]['used_memory'] / MIB:.1f} MiB", file=sys.stderr)
    for target in checkpoints:
        opened = rows[-1]["sessions"]
        seconds = asyncio.run(open_many(url, key, opened, target - opened, concurrency))
        rows.append({"sessions": target, "rss": settled_rss(pid), **redis_figures(store), "seconds": seconds})
        row = rows[-1]
        print(
            f"{target:6} sessions ({(target - opened) / seconds:.0f}/s): RSS {row['rss'] / MIB:.1f} MiB, "
            f"Redis {row['used_memory'] / MIB:.1f} MiB, own keys {row['db_keys']}",
            file=sys.stderr,
        )
    return rows


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = [
        "| sessions | web RSS MiB | growth MiB | MiB / 1,000 | Redis used_memory MiB | growth MiB | MiB / 1,000 "
        "| bench db keys | their MEMORY USAGE MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        grown, redis_grown = (row["rss"] - base["rss"]) / MIB, (row["used_memory"] - base["used_memory"]) / MIB
        per, redis_per = (
            f"{mib * 1000 / row['sessions']:.2f}" if row["sessions"] else "" for mib in (grown, redis_grown)
        )
        lines.append(
            f"| {row['sessions']} | {row['rss'] / MIB:.1f} | {grown:.1f} | {per} | {row['used_memory'] / MIB:.1f} "
            f"| {redis_grown:.1f} | {redis_per} | {row['db_keys']} | {row['db_key_bytes'] / MIB:.2f} |"
        )
    return "\n".join(lines)


def attribute(key: str, sessions: int, concurrency: int, env: dict[str, str], work: Path) -> None:
    """Python heap growth per session under tracemalloc, by the package whose code allocated it."""
    gateway, out = traced_gateway(env, work, "idle_sessions")
    try:
        asyncio.run(open_many(f"{gateway.url}/mcp", key, -WARMUP, WARMUP, concurrency))
        before = traced_snapshot(gateway.process.pid, Path(f"{out}.1"))
        asyncio.run(open_many(f"{gateway.url}/mcp", key, 0, sessions, concurrency))
        after = traced_snapshot(gateway.process.pid, Path(f"{out}.2"))
    finally:
        gateway.stop()
    print(growth_report(before, after, sessions, "session"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--checkpoints", default="1000,5000,10000")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--attribute", type=int, default=0, help="then open this many under tracemalloc")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/idle_sessions.json")
    args = parser.parse_args()
    checkpoints = sorted({int(c) for c in args.checkpoints.split(",") if int(c) < args.sessions} | {args.sessions})
    key = setup_database()
    store = redis.Redis.from_url(os.environ["REDIS_URL"])
    idle = 1800.0
    env = dict(os.environ) | {
        "GATEWAY_EXECUTOR": "inline",
        "GATEWAY_MAX_LEGACY_SESSIONS": str(2 * max(args.sessions, args.attribute) + WARMUP),
    }
    env["GATEWAY_SESSION_IDLE_SECONDS"] = os.environ.get("GATEWAY_SESSION_IDLE_SECONDS", str(idle))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    gateway = servers.start_gateway(env, args.out.parent / "idle_sessions.log")
    started = time.monotonic()
    try:
        rows = measure(f"{gateway.url}/mcp", key, gateway.process.pid, store, checkpoints, args.concurrency)
    finally:
        gateway.stop()
    elapsed = time.monotonic() - started
    if elapsed >= float(env["GATEWAY_SESSION_IDLE_SECONDS"]):
        raise SystemExit(f"the run took {elapsed:.0f} s, past the session idle time: early sessions may have expired")
    args.out.write_text(json.dumps(rows, indent=2))
    print(f"{args.sessions} sessions in {elapsed:.0f} s (idle expiry {env['GATEWAY_SESSION_IDLE_SECONDS']} s)\n")
    print(table(rows))
    if args.attribute:
        attribute(key, args.attribute, args.concurrency, env, args.out.parent)


if __name__ == "__main__":
    main()
