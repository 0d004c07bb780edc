"""The CPU of one EVALSHA (a small script returning three bulk strings, as a call's scripts do) in this process,
per op, in microseconds, by three clients in the same run, their rounds interleaved:

- client: redis-py's asyncio client (its pool, its retry), as script_run used until the line;
- conn: redis-py's own Connection used directly, one for the loop, behind a lock (no pool, no retry);
- line: gateway_project/lib/redis_line.py, one multiplexed connection parsed by hiredis.

Each at 1, 8 and 32 tasks running ops at once, under uvloop as the gateway runs.

    REDIS_URL=redis://127.0.0.1:6379/14 .venv/bin/python bench/redis_line.py --ops 5000 --rounds 3
"""

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")

import django  # noqa: E402

django.setup()

import redis.asyncio  # noqa: E402
import uvloop  # noqa: E402
from django.conf import settings  # noqa: E402

from gateway_project.lib import redis_line  # noqa: E402

SCRIPT = "return {KEYS[1], ARGV[1], redis.call('GET', KEYS[1])}"
KEY = "bench-redis-line"


async def clients() -> dict[str, Callable[[], Awaitable]]:
    client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
    sha = await client.script_load(SCRIPT)
    await client.set(KEY, "v" * 300, ex=600)
    conn = client.connection_pool.make_connection()
    await conn.connect()
    lock = asyncio.Lock()
    line = redis_line.line_for(settings.REDIS_URL)

    async def by_conn() -> object:
        async with lock:
            await conn.send_command("EVALSHA", sha, 1, KEY, "a")
            return await conn.read_response()

    return {
        "client": lambda: client.evalsha(sha, 1, KEY, "a"),
        "conn": by_conn,
        "line": lambda: line.command("EVALSHA", sha, 1, KEY, "a"),
    }


async def per_op(op: Callable[[], Awaitable], ops: int, tasks: int) -> tuple[float, float]:
    """CPU and wall time per op, in microseconds."""

    async def worker(n: int) -> None:
        for _ in range(n):
            await op()

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(ops // tasks) for _ in range(tasks)))
    done = ops // tasks * tasks
    return (time.process_time() - cpu) / done * 1e6, (time.perf_counter() - wall) / done * 1e6


async def main(args: argparse.Namespace) -> None:
    ops = await clients()
    for op in ops.values():  # warm: connections open, code paths taken
        await per_op(op, 300, 1)
    seen: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for tasks in args.tasks:
            for name, op in ops.items():
                seen.setdefault((name, tasks), []).append(await per_op(op, args.ops, tasks))
    print(f"us/op, median of {args.rounds} interleaved rounds of {args.ops} ops (CPU min-max; wall)")
    for tasks in args.tasks:
        client = statistics.median(cpu for cpu, _ in seen[("client", tasks)])
        for name in ops:
            cpus = [cpu for cpu, _ in seen[(name, tasks)]]
            median, wall = statistics.median(cpus), statistics.median(w for _, w in seen[(name, tasks)])
            print(
                f"  {tasks:>2} tasks {name:6} CPU {median:6.1f} ({min(cpus):.1f}-{max(cpus):.1f})"
                f" {median / client:.2f}x client; wall {wall:6.1f}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=lambda s: [int(n) for n in s.split(",")], default=[1, 8, 32])
    uvloop.run(main(parser.parse_args()))
