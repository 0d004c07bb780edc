"""tools/call latency and throughput, in one run, against:

- direct:  the demo upstream over stdio, one subprocess per client session (no gateway at all);
- proxy:   the same stdio upstream behind mcp-proxy, the minimal pass-through proxy (our floor);
- sdk:     the same pass-through on the gateway's own stack (the `mcp` 2.x SDK's server under Daphne,
           bench/sdk_passthrough.py): what that stack costs before the gateway does anything;
- inline:  Switchboard with the inline executor;
- inline-uvicorn, inline-granian: the same under uvicorn (uvloop, httptools) and under granian instead of
           Daphne (tests/servers.py UVICORN, GRANIAN), started only when named in --targets;
- inline-uvicorn-local: inline-uvicorn with GATEWAY_AUDIT_COMMIT=local (audit commits not flushed to disk);
- celery-uvicorn: the Celery gateway under uvicorn, sharing `celery`'s worker (its server CPU is the gateway's alone);
- celery-direct-uvicorn: celery-uvicorn with GATEWAY_CALL_TRANSPORT=direct (calls to the worker's call consumer);
- pair:    two inline-uvicorn gateways behind HAProxy in round robin (server CPU: both gateways'), when named;
- celery:  Switchboard with the Celery executor and a worker;
- embedded: the gateway as scripts/demo serves it (Daphne, SQLite in a var dir of its own, no Redis, inline),
           started only when named in --targets;

the other Switchboard targets with audit on PostgreSQL. Every target is driven by the official SDK client
(2025-11-25, the one era mcp-proxy speaks) at 1, 8 and 32 concurrent sessions. Figures are printed as a
Markdown table, with ratios to the proxy measured in the same run, and saved as JSON. Beside latency and
throughput, each target's CPU per call is read from /proc: its server's processes (with their upstreams
and, for Celery, the worker) and the whole machine's, client, PostgreSQL and Redis included.

    bench/run            # see bench/run for the environment it sets up
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
os.environ["GATEWAY_EXECUTOR"] = "inline"  # this process syncs the catalog itself; targets get their own

from tests import servers  # noqa: E402  (the process helpers the tests use)

DEMO = [sys.executable, str(ROOT / "examples/demo_upstream.py")]
PROXY = ROOT / ".venv-proxy/bin/mcp-proxy"
SDK_PASSTHROUGH = "bench.sdk_passthrough:app"
ARGUMENTS = {"text": "benchmark"}
# The inline gateway under another server, or with another setting: started only when named in --targets.
OTHER_SERVERS = {
    "inline-uvicorn": (servers.UVICORN, {}),
    "inline-granian": (servers.GRANIAN, {}),
    "inline-uvicorn-local": (servers.UVICORN, {"GATEWAY_AUDIT_COMMIT": "local"}),
    "celery-uvicorn": (servers.UVICORN, {"GATEWAY_EXECUTOR": "celery"}),  # the same worker as `celery`
    # The same worker, which takes calls pushed past Celery's consumer on its pool's loop (registry/call_consumer.py).
    "celery-direct-uvicorn": (servers.UVICORN, {"GATEWAY_EXECUTOR": "celery", "GATEWAY_CALL_TRANSPORT": "direct"}),
}


def setup_database() -> str:
    """A migrated benchmark database with one agent and the demo upstream; returns the agent's key."""
    import django
    from django.core.management import call_command

    django.setup()
    from django.db import connection

    from policy.models import Agent
    from policy.services import agent_create
    from registry.models import Upstream
    from registry.services import upstream_catalog_sync, upstream_save

    call_command("migrate", verbosity=0)
    Agent.objects.filter(name="bench").delete()
    Upstream.objects.filter(slug="demo").delete()
    if connection.vendor == "postgresql":  # the bench's own database: start from an empty trail (SQLite's is new)
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE audit_auditevent, audit_auditcheckpoint")
    # Every limit is on, as in production, set high enough that the benchmark measures and never trips one.
    unlimited = 10**9
    upstream = Upstream(slug="demo", transport="stdio", command=DEMO[0], args=DEMO[1:], calls_per_minute=unlimited)
    upstream_save(upstream=upstream, created=True)
    assert upstream_catalog_sync(upstream=upstream).ok
    issued = agent_create(name="bench")
    Agent.objects.filter(pk=issued.agent.pk).update(calls_per_minute=unlimited, max_calls_per_session=unlimited)
    return issued.key


@asynccontextmanager
async def http_session(url: str, headers: dict[str, str]) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            yield client


def stdio_session() -> Client:
    return Client(StdioServerParameters(command=DEMO[0], args=DEMO[1:]), mode="legacy")


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy (every state but idle and iowait) since boot."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS


def process_cpu_seconds(pid: int) -> float:
    """CPU time of one process alone (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def processes_cpu() -> dict[int, tuple[str, int, float]]:
    """Every live process's name, parent and CPU seconds so far (its threads', not its children's)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, tail = stat.read_text().rsplit(")", 1)
        except OSError:  # gone meanwhile
            continue
        fields = tail.split()
        found[int(stat.parent.name)] = (head.split("(", 1)[1], int(fields[1]), (int(fields[11]) + int(fields[12])))
    return {pid: (name, parent, ticks / CLOCK_TICKS) for pid, (name, parent, ticks) in found.items()}


def spawned_by(found: dict[int, tuple[str, int, float]], root: int) -> set[int]:
    """The processes `root` spawned, and theirs, in a `processes_cpu` reading."""
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _) in found.items():
        children.setdefault(parent, []).append(pid)
    spawned, waiting = set(), list(children.get(root, []))
    while waiting:
        pid = waiting.pop()
        spawned.add(pid)
        waiting += children.get(pid, [])
    return spawned


def cpu_by_part(before: dict, after: dict, server_pid: int | None) -> dict[str, float]:
    """The CPU seconds spent between two `processes_cpu` readings, by part: this process (the client), the server's
    process, what it spawned (its upstream, with any sandbox around it), PostgreSQL, Redis, and the rest."""
    part = {os.getpid(): "client"}
    if server_pid is not None:
        part |= dict.fromkeys(spawned_by(after, server_pid), "upstream") | {server_pid: "server"}
    spent: dict[str, float] = dict.fromkeys(("client", "server", "upstream", "postgres", "redis", "rest"), 0.0)
    for pid, (name, _, seconds) in after.items():
        name_part = "postgres" if name.startswith("postgres") else "redis" if name.startswith("redis") else "rest"
        spent[part.get(pid, name_part)] += seconds - before.get(pid, (name, 0, 0.0))[2]
    return spent


def sessions_cpu_seconds(session_ids: Collection[int]) -> float:
    """CPU time of the live processes in these process sessions (a server with its upstreams)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) in session_ids:
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


# What a block does around each call, by the session's index: `around(session, call)` awaits `call()` and answers
# its result (bench/floor.py's promises, made in the call's sequence).
Around = Callable[[int, Callable[[], Awaitable[Any]]], Awaitable[Any]]


async def _plain(session: int, call: Callable[[], Awaitable[Any]]) -> Any:
    return await call()


@asynccontextmanager
async def opened(
    open_session: Callable,
    tool: str,
    sessions: int,
    warmup: int,
    server_cpu: Callable[[], float] | None,
    around: Around = _plain,
) -> AsyncIterator[Callable[[int], Awaitable[dict]]]:
    """`sessions` concurrent sessions, open and warmed by `warmup` calls on each, for as long as the block runs:
    yields `block(calls)`, which spreads `calls` calls over them and answers what it measured (its latencies, wall
    time, the server's CPU seconds by `server_cpu` (sessions_cpu_seconds, process_cpu_seconds; None for no
    server) and the machine's)."""
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(open_session()) for _ in range(sessions)]

        async def drive(session: int, count: int, latencies: list[float] | None) -> None:
            client = clients[session]
            for _ in range(count):
                started = time.perf_counter()
                result = await around(session, partial(client.call_tool, tool, ARGUMENTS))
                if latencies is not None:
                    latencies.append(time.perf_counter() - started)
                assert not result.is_error, result

        async def block(calls: int) -> dict:
            latencies: list[float] = []
            machine, server = machine_cpu_seconds(), server_cpu() if server_cpu else 0.0
            started = time.perf_counter()
            await asyncio.gather(*(drive(session, calls // sessions, latencies) for session in range(sessions)))
            wall = time.perf_counter() - started
            machine, server = machine_cpu_seconds() - machine, (server_cpu() if server_cpu else 0.0) - server
            return {"latencies": latencies, "wall": wall, "server": server if server_cpu else None, "machine": machine}

        await asyncio.gather(*(drive(session, warmup, None) for session in range(sessions)))
        yield block


def summary(sessions: int, blocks: list[dict]) -> dict:
    """What `opened`'s blocks measured, pooled: percentiles of every latency, calls/s over their wall time."""
    latencies = [latency for block in blocks for latency in block["latencies"]]
    wall, machine = sum(block["wall"] for block in blocks), sum(block["machine"] for block in blocks)
    server = None if blocks[0]["server"] is None else sum(block["server"] for block in blocks)
    cut = statistics.quantiles(latencies, n=100)
    return {
        "sessions": sessions,
        "calls": len(latencies),
        "p50_ms": cut[49] * 1000,
        "p90_ms": cut[89] * 1000,
        "p99_ms": cut[98] * 1000,
        "calls_per_s": len(latencies) / wall,
        "server_cpu_ms": server * 1000 / len(latencies) if server is not None else None,
        "machine_cpu_ms": machine * 1000 / len(latencies),
    }


async def measure(
    open_session: Callable, tool: str, sessions: int, calls: int, warmup: int, server_cpu: Callable[[], float] | None
) -> dict:
    """`calls` calls spread over `sessions` concurrent sessions, after `warmup` calls on each."""
    async with opened(open_session, tool, sessions, warmup, server_cpu) as block:
        return summary(sessions, [await block(calls)])


def start_targets(key: str, logs: Path, names: Collection[str]) -> tuple[dict, list]:
    env = dict(os.environ)
    started = []
    proxy_port = servers.free_port()
    proxy = servers.start(
        [str(PROXY), "--port", str(proxy_port), "--host", "127.0.0.1", "--log-level", "WARNING", "--", *DEMO],
        env,
        logs / "proxy.log",
    )
    servers.wait_for_port(proxy_port, proxy, logs / "proxy.log")
    started.append(servers.Running(proxy, logs / "proxy.log"))
    sdk_port = servers.free_port()
    sdk_command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(sdk_port), SDK_PASSTHROUGH]
    sdk = servers.start(sdk_command, env, logs / "sdk.log")
    servers.wait_for_port(sdk_port, sdk, logs / "sdk.log")
    started.append(servers.Running(sdk, logs / "sdk.log"))
    inline = servers.start_gateway(env | {"GATEWAY_EXECUTOR": "inline"}, logs / "inline.log")
    worker = servers.start_worker(env | {"GATEWAY_EXECUTOR": "celery"}, logs / "worker.log")
    celery = servers.start_gateway(env | {"GATEWAY_EXECUTOR": "celery"}, logs / "celery.log")
    started += [inline, worker, celery]
    auth = {"Authorization": f"Bearer {key}"}
    under = {
        name: servers.start_gateway_under(server, env | {"GATEWAY_EXECUTOR": "inline"} | extra, logs / f"{name}.log")
        for name, (server, extra) in OTHER_SERVERS.items()
        if name in names
    }
    started += under.values()
    if "pair" in names:
        started += (pair := start_pair(env | {"GATEWAY_EXECUTOR": "inline"}, logs))
    # Each server runs in a process session of its own (servers.start), so its upstreams count with it.
    targets = {
        "direct": (stdio_session, "echo", ()),
        "proxy": (lambda: http_session(f"http://127.0.0.1:{proxy_port}/mcp", {}), "echo", {proxy.pid}),
        "sdk": (lambda: http_session(f"http://127.0.0.1:{sdk_port}/mcp", {}), "echo", {sdk.pid}),
        "inline": (lambda: http_session(f"{inline.url}/mcp", auth), "demo__echo", {inline.process.pid}),
        "celery": (
            lambda: http_session(f"{celery.url}/mcp", auth),
            "demo__echo",
            {celery.process.pid, worker.process.pid},
        ),
    }
    for name, running in under.items():
        targets[name] = (lambda url=running.url: http_session(f"{url}/mcp", auth), "demo__echo", {running.process.pid})
    if "embedded" in names:
        embedded, embedded_key = start_embedded(logs)
        started.append(embedded)
        embedded_auth = {"Authorization": f"Bearer {embedded_key}"}
        targets["embedded"] = (
            lambda: http_session(f"{embedded.url}/mcp", embedded_auth),
            "demo__echo",
            {embedded.process.pid},
        )
    if "pair" in names:
        balancer, *gateways = pair
        pids = {g.process.pid for g in gateways}
        targets["pair"] = (lambda url=balancer.url: http_session(f"{url}/mcp", auth), "demo__echo", pids)
    return targets, started


EMBEDDED_SETUP = "import sys; sys.path.insert(0, 'bench'); from run import setup_database; print(setup_database())"


def start_embedded(logs: Path) -> tuple[servers.Running, str]:
    """The gateway as scripts/demo serves it, on a fresh SQLite database set up as setup_database sets up the
    others; returns it and its agent's key."""
    var = logs / "embedded-var"
    shutil.rmtree(var, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {"SWITCHBOARD_VAR_DIR": str(var), "GATEWAY_EXECUTOR": "inline"}
    setup = [sys.executable, "-c", EMBEDDED_SETUP]
    key = subprocess.run(setup, env=env, cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()[-1]
    return servers.start_gateway(env, logs / "embedded.log"), key


def start_pair(env: dict[str, str], logs: Path) -> list[servers.Running]:
    """Two inline gateways under uvicorn behind HAProxy in round robin (no affinity: sessions are in Redis)."""
    gateways = [servers.start_gateway_under(servers.UVICORN, env, logs / f"pair-{n}.log") for n in "ab"]
    return [servers.start_balancer(gateways, env, logs), *gateways]


def table(results: list[dict]) -> str:
    floor = {r["sessions"]: r for r in results if r["target"] == "proxy"}
    lines = [
        "| target | sessions | p50 ms | p90 ms | p99 ms | calls/s | p50 / proxy | calls/s / proxy "
        "| server CPU ms/call | machine CPU ms/call |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        base = floor[r["sessions"]]
        server = "" if r["server_cpu_ms"] is None else f"{r['server_cpu_ms']:.2f}"
        lines.append(
            f"| {r['target']} | {r['sessions']} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['calls_per_s']:.0f} | {r['p50_ms'] / base['p50_ms']:.2f} | "
            f"{r['calls_per_s'] / base['calls_per_s']:.2f} | {server} | {r['machine_cpu_ms']:.2f} |"
        )
    return "\n".join(lines)


def added_table(results: list[dict]) -> str:
    """What each gateway adds over the same pass-through on its own stack (the `sdk` target), per level."""
    stack = {r["sessions"]: r for r in results if r["target"] == "sdk"}
    lines = [
        "| target | sessions | p50 added ms | server CPU added ms/call | calls/s / sdk |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if r["target"] in ("inline", "celery", "pair", *OTHER_SERVERS) and (base := stack.get(r["sessions"])):
            lines.append(
                f"| {r['target']} | {r['sessions']} | {r['p50_ms'] - base['p50_ms']:.2f} | "
                f"{r['server_cpu_ms'] - base['server_cpu_ms']:.2f} | {r['calls_per_s'] / base['calls_per_s']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=640, help="measured calls per target and concurrency")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured calls per session first")
    parser.add_argument("--sessions", default="1,8,32")
    parser.add_argument("--targets", default="direct,proxy,sdk,inline,celery")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/latest.json")
    args = parser.parse_args()
    database = urlsplit(os.environ["DATABASE_URL"]).path
    print(f"database {database}, redis {os.environ['REDIS_URL']}", file=sys.stderr)
    key = setup_database()
    logs = args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    targets, started = start_targets(key, logs, args.targets.split(","))
    try:
        results = asyncio.run(measure_all(targets, args))
    finally:
        for running in started:
            running.stop()
    args.out.write_text(json.dumps(results, indent=2))
    print(table(results))
    if any(r["target"] == "sdk" for r in results):
        print("\nWhat the gateway adds over its own stack (the sdk pass-through):\n")
        print(added_table(results))


async def measure_all(targets: dict, args: argparse.Namespace) -> list[dict]:
    results = []
    # Interleave targets within each concurrency so drifts in machine load hit all of them alike.
    for sessions in (int(s) for s in args.sessions.split(",")):
        for name in args.targets.split(","):
            open_session, tool, server_sessions = targets[name]
            server_cpu = (lambda ids=server_sessions: sessions_cpu_seconds(ids)) if server_sessions else None
            result = await measure(open_session, tool, sessions, args.calls, args.warmup, server_cpu)
            results.append({"target": name, **result})
            print(
                f"{name:14} {sessions:3} sessions  p50 {result['p50_ms']:.2f} ms  {result['calls_per_s']:.0f} calls/s  "
                f"machine CPU {result['machine_cpu_ms']:.2f} ms/call",
                file=sys.stderr,
            )
    return results


if __name__ == "__main__":
    main()
