"""Soak (docs/reliability.md, "Soak"): a gateway under Daphne with the Celery executor and a worker, the demo
stdio upstream, the example handoff specialist and code mode, driven at a steady rate for `--minutes` by a few
SDK client sessions of both eras (2025-11-25 and 2026-07-28) with a mix of tools/call, tools/list, handoff
round trips and code-mode executions. Every `--every` seconds it samples the RSS and open file descriptors of
every process the soak started (the gateway, the worker and its children: the stdio upstream and each Deno
sandbox, the specialist, Redis) and Redis's `used_memory`. It writes the samples as JSON, plots them, and
judges the last two thirds of the run: each process's RSS grows under 5 % and under 0.2 MiB/min (a linear
fit), open file descriptors and Redis memory stay within ±10 % of their level at the window's start. It exits
non-zero when a call failed or a bar does not hold.

It runs on a PostgreSQL database of its own (created when missing) and a Redis server of its own, started
here on a free port: `used_memory` is the whole server's, so a shared one would count the tests' and the
other benchmarks' keys too.

    bench/run soak                      # 30 minutes on switchboard_soak (see bench/run)
    bench/run soak --minutes 5 --every 5
"""

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import numpy as np
import psycopg
import redis
from matplotlib.figure import Figure
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402  (the process helpers the tests use)

DEMO = [sys.executable, str(ROOT / "examples/demo_upstream.py")]
AGENT_PREFIX = "soak-"
DOMAIN = "finance"
TRIAGE = f"switchboard__handoff_to_{DOMAIN}"
RETURN = "switchboard__return_to_triage"
MODES = ["legacy", "2026-07-28"]
CODE = """const sum = await tools.demo.add({ a: 40, b: 2 });
const echoed = await tools.demo.echo({ text: "soak" });
return { sum, echoed };"""
# One client's operations, in this order, over and over: 25 operations of which one handoff round trip
# (three calls) and two code-mode executions (a search, then an execution that makes two calls).
MIX = ["call", "list", "call", "call", "execute", "call", "list", "call", "call", "call", "handoff", "call", "list"]
MIX += ["call", "call", "call", "execute", "call", "list", "call", "call", "call", "list", "call", "call"]
# The bars, over the last two thirds of the run; shorter runs are sampled and plotted but not judged.
RSS_GROWTH_PERCENT = 5.0
RSS_MIB_PER_MINUTE = 0.2
DRIFT_PERCENT = 10.0
# A level is the median of a minute's samples, not one sample: a gateway's descriptors at an instant count the
# connections open at that instant.
LEVEL_SECONDS = 60.0
MIN_JUDGED_MINUTES = 10.0
MIB = 1024 * 1024


# Setting up: the database, Redis, the data, the processes.


def database_ensure(url: str) -> None:
    """Create the soak's database when it does not exist (connected to the server's `postgres` database)."""
    name = urlsplit(url).path.lstrip("/")
    admin = urlsplit(url)._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
            connection.execute(f'CREATE DATABASE "{name}"')


def redis_start(logs: Path) -> tuple[servers.Running, str]:
    port = servers.free_port()
    command = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
    process = servers.start(command, dict(os.environ), logs / "soak-redis.log")
    servers.wait_for_port(port, process, logs / "soak-redis.log")
    return servers.Running(process, logs / "soak-redis.log"), f"redis://127.0.0.1:{port}/0"


def data_setup(clients: int) -> list[str]:
    """A migrated database with the demo upstream and one agent per client session; returns their keys.
    The trail is emptied first: the soak's own database, and its size is not what is measured."""
    import django
    from django.core.management import call_command

    django.setup()
    from django.db import connection

    from policy.models import Agent
    from policy.services import agent_create
    from registry.models import Upstream
    from registry.services import upstream_catalog_sync, upstream_save

    call_command("migrate", verbosity=0)
    Agent.objects.filter(name__startswith=AGENT_PREFIX).delete()
    Upstream.objects.filter(slug__in=["demo", DOMAIN]).delete()
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE audit_auditevent, audit_auditcheckpoint")
    unlimited = 10**9  # limits on, as in production, set high enough never to trip
    upstream = Upstream(slug="demo", transport="stdio", command=DEMO[0], args=DEMO[1:], calls_per_minute=unlimited)
    upstream_save(upstream=upstream, created=True)
    assert upstream_catalog_sync(upstream=upstream).ok
    keys = []
    for n in range(clients):
        issued = agent_create(name=f"{AGENT_PREFIX}{n}")
        Agent.objects.filter(pk=issued.agent.pk).update(calls_per_minute=unlimited, max_calls_per_session=unlimited)
        keys.append(issued.key)
    return keys


def specialist_setup(url: str) -> None:
    """The specialist as a handoff-only upstream with a route of its domain (as tests/factories.py does)."""
    from handoff.models import HandoffRoute
    from registry.models import Upstream
    from registry.services import upstream_save

    upstream = Upstream(slug=DOMAIN, transport="streamable_http", url=url, handoff_only=True)
    upstream.full_clean()
    upstream_save(upstream=upstream, created=True)
    HandoffRoute.objects.create(domain=DOMAIN, description="Questions for the finance specialist.", target=upstream)


def processes_start(env: dict[str, str], logs: Path) -> dict[str, servers.Running]:
    worker = servers.start_worker(env, logs / "soak-worker.log")
    gateway = servers.start_gateway(env, logs / "soak-gateway.log")
    specialist = servers.start_specialist(DOMAIN, env, gateway.url, logs / "soak-specialist.log")
    return {"gateway": gateway, "worker": worker, "specialist": specialist}


# Sampling: each server started here and its descendants (a worker's stdio upstream, each Deno sandbox), walked
# by parent pid: the pool starts an upstream in a process session of its own.


def command_name(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    script = next((a for a in argv[1:] if a.endswith(b".py")), None)
    return Path((script or argv[0]).decode(errors="replace")).name


def processes_find(roots: dict[str, int]) -> dict[int, str]:
    """Each live process the soak started, labelled by its server (and its command, for a descendant)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError):  # gone meanwhile
            continue
    found = {}
    for role, root in roots.items():
        found[root] = role
        todo = list(children.get(root, []))
        while todo:
            pid = todo.pop()
            try:
                found[pid] = f"{role}/{command_name(pid)}"
            except OSError:
                continue
            todo += children.get(pid, [])
    return found


def process_measure(pid: int) -> tuple[int, int] | None:
    """(VmRSS in KiB, open file descriptors), or None for a process that is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return (int(rss), fds) if rss is not None else None


def sample_take(roots: dict[str, int], store: redis.Redis, started: float, done: int) -> dict:
    measured = {}
    for pid, label in processes_find(roots).items():
        if (measure := process_measure(pid)) is not None:
            measured[str(pid)] = {"label": label, "rss_kib": measure[0], "fds": measure[1]}
    memory = store.info("memory")["used_memory"]
    return {"t": time.monotonic() - started, "operations": done, "processes": measured, "redis_used_memory": memory}


# The load: `clients` sessions, each running MIX at its share of `rate`, reconnecting every `session_ops`.


class Refused(Exception):
    """An operation's answer was not the one expected."""


@dataclass
class Tally:
    done: Counter = field(default_factory=Counter)
    failed: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)

    def fail(self, kind: str, error: BaseException) -> None:
        self.failed[kind] += 1
        if len(self.errors) < 20:
            self.errors.append(f"{kind}: {type(error).__name__}: {error}"[:500])


def text_of(result) -> str:
    if result.is_error:
        raise Refused(f"error result: {result.content}")
    return "".join(getattr(part, "text", "") for part in result.content)


async def op_call(client: Client, n: int) -> None:
    if n % 2:
        expect(text_of(await client.call_tool("demo__echo", {"text": f"soak {n}"})), f"soak {n}")
    else:
        expect(text_of(await client.call_tool("demo__add", {"a": n, "b": 1})), str(n + 1))


async def op_list(client: Client, n: int) -> None:
    names = {tool.name for tool in (await client.list_tools(cache_mode="bypass")).tools}
    if not {"demo__echo", TRIAGE, "switchboard__execute"} <= names:
        raise Refused(f"tools/list lacks a tool: {sorted(names)}")


async def op_handoff(client: Client, n: int) -> None:
    handed = text_of(await client.call_tool(TRIAGE, {"reason": "a soak question", "context": {"n": n}}))
    expect(handed, "Handed off to the finance specialist.")
    expect(text_of(await client.call_tool(f"{DOMAIN}__ask", {"question": f"q{n}"})), f"'q{n}'")
    expect(text_of(await client.call_tool(RETURN, {"note": f"n{n}"})), f"summary: n{n}")


async def op_execute(client: Client, n: int) -> None:
    found = text_of(await client.call_tool("switchboard__search_tools", {"query": "add two numbers", "k": 3}))
    expect(found, "tools.demo.add")
    expect(text_of(await client.call_tool("switchboard__execute", {"code": CODE})), '"sum": 42')


def expect(text: str, part: str) -> None:
    if part not in text:
        raise Refused(f"expected {part!r} in {text[:300]!r}")


OPERATIONS: dict[str, Callable[[Client, int], Awaitable[None]]] = {
    "call": op_call,
    "list": op_list,
    "handoff": op_handoff,
    "execute": op_execute,
}


@asynccontextmanager
async def client_session(url: str, key: str, mode: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client:
            yield client


async def client_drive(
    url: str, key: str, mode: str, interval: float, deadline: float, session_ops: int, tally: Tally, offset: int
) -> None:
    """MIX from `offset`, one operation every `interval` seconds (late ones are not made up in a burst)."""
    mix = itertools.islice(itertools.cycle(MIX), offset, None)
    counter = itertools.count()
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        kind = "connect"
        try:
            async with client_session(url, key, mode) as client:
                for _ in range(session_ops):
                    next_at = max(next_at + interval, time.monotonic() - interval)
                    await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                    if time.monotonic() >= deadline:
                        return
                    kind = next(mix)
                    await OPERATIONS[kind](client, next(counter))
                    tally.done[kind] += 1
                kind = "disconnect"
        except Exception as error:  # every failure is counted and reported; the client opens a new session
            tally.fail(kind, error)


async def ready_wait(url: str, key: str) -> None:
    """Until the gateway lists the triage tool (its snapshot has the route), within a bound."""
    deadline = time.monotonic() + 30
    while True:
        async with client_session(url, key, "legacy") as client:
            names = {tool.name for tool in (await client.list_tools(cache_mode="bypass")).tools}
        if TRIAGE in names or time.monotonic() > deadline:
            return
        await asyncio.sleep(0.2)


async def soak(args: argparse.Namespace, url: str, keys: list[str], roots: dict[str, int], store: redis.Redis) -> dict:
    await ready_wait(url, keys[0])
    tally, samples = Tally(), []
    started = time.monotonic()
    deadline = started + args.minutes * 60
    interval = len(keys) / args.rate
    drives = [
        client_drive(url, key, MODES[n % 2], interval, deadline, args.session_ops, tally, n * 7)
        for n, key in enumerate(keys)
    ]
    clients = asyncio.gather(*drives)
    while not clients.done():
        samples.append(sample_take(roots, store, started, sum(tally.done.values())))
        print(f"{samples[-1]['t'] / 60:5.1f} min  {dict(tally.done)}  failed {dict(tally.failed)}", file=sys.stderr)
        await asyncio.wait([clients], timeout=args.every)
    await clients
    samples.append(sample_take(roots, store, started, sum(tally.done.values())))
    return {"samples": samples, "done": dict(tally.done), "failed": dict(tally.failed), "errors": tally.errors}


# Judging.


@dataclass
class Row:
    label: str
    pid: str
    rss_start_mib: float  # the linear fit at the window's start and end
    rss_end_mib: float
    growth_percent: float
    mib_per_minute: float
    fds_start: float  # the levels of the window's first and last minutes
    fds_end: float
    fds_min: int
    fds_max: int
    fds_ok: bool
    rss_ok: bool


def levels(points: list[tuple[float, float]]) -> tuple[float, float]:
    """The median of the first minute's values and of the last minute's."""
    first, last = points[0][0], points[-1][0]
    start = statistics.median([value for t, value in points if t < first + LEVEL_SECONDS])
    return start, statistics.median([value for t, value in points if t > last - LEVEL_SECONDS])


def drift_holds(start: float, end: float) -> bool:
    return abs(end - start) <= start * DRIFT_PERCENT / 100


def process_judge(label: str, pid: str, points: list[tuple[float, int, int]]) -> Row:
    minutes = np.array([t / 60 for t, _, _ in points])
    rss = np.array([kib / 1024 for _, kib, _ in points])
    slope, intercept = np.polyfit(minutes, rss, 1)
    first, last = intercept + slope * minutes[0], intercept + slope * minutes[-1]
    growth = (last - first) / first * 100
    fds = [(t, float(n)) for t, _, n in points]
    fds_start, fds_end = levels(fds)
    return Row(
        label=label,
        pid=pid,
        rss_start_mib=float(first),
        rss_end_mib=float(last),
        growth_percent=float(growth),
        mib_per_minute=float(slope),
        fds_start=fds_start,
        fds_end=fds_end,
        fds_min=int(min(n for _, n in fds)),
        fds_max=int(max(n for _, n in fds)),
        fds_ok=drift_holds(fds_start, fds_end),
        rss_ok=bool(growth < RSS_GROWTH_PERCENT and slope < RSS_MIB_PER_MINUTE),
    )


def judge(samples: list[dict], start: float) -> dict:
    """The bars over the samples from `start` (seconds) on, for each process alive through that whole window
    (a Deno sandbox lives for one execution: counted, not judged) and for Redis's used_memory."""
    window = [s for s in samples if s["t"] >= start]
    series: dict[str, list[tuple[float, int, int]]] = {}
    labels: dict[str, str] = {}
    for sample in window:
        for pid, p in sample["processes"].items():
            series.setdefault(pid, []).append((sample["t"], p["rss_kib"], p["fds"]))
            labels[pid] = p["label"]
    lasting = [pid for pid, points in series.items() if len(points) == len(window)]
    rows = [process_judge(labels[pid], pid, series[pid]) for pid in lasting]
    memory = [(s["t"], float(s["redis_used_memory"])) for s in window]
    values = [value for _, value in memory]
    redis_start, redis_end = levels(memory)
    redis_row = {"start": redis_start, "end": redis_end, "min": min(values), "max": max(values)}
    redis_row["ok"] = drift_holds(redis_start, redis_end)
    transient = Counter(labels[pid] for pid in series if pid not in lasting)
    ok = all(row.rss_ok and row.fds_ok for row in rows) and redis_row["ok"]
    rows_out = [asdict(row) for row in sorted(rows, key=lambda r: r.label)]
    return {"rows": rows_out, "redis": redis_row, "transient": dict(transient), "ok": ok, "from_seconds": start}


def table(verdict: dict) -> str:
    lines = [
        "| process | RSS start MiB | RSS end MiB | growth % | MiB/min | fds start | fds end | fds min–max "
        "| RSS | fds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in verdict["rows"]:
        lines.append(
            f"| {r['label']} | {r['rss_start_mib']:.1f} | {r['rss_end_mib']:.1f} | {r['growth_percent']:+.2f} | "
            f"{r['mib_per_minute']:+.3f} | {r['fds_start']:.0f} | {r['fds_end']:.0f} | {r['fds_min']}–{r['fds_max']} | "
            f"{'holds' if r['rss_ok'] else 'FAILS'} | {'holds' if r['fds_ok'] else 'FAILS'} |"
        )
    memory = verdict["redis"]
    lines.append(
        f"\nRedis used_memory: {memory['start'] / MIB:.2f} MiB in the window's first minute, "
        f"{memory['end'] / MIB:.2f} MiB in its last ({memory['min'] / MIB:.2f}–{memory['max'] / MIB:.2f} MiB over it): "
        f"{'holds' if memory['ok'] else 'FAILS'}"
    )
    if verdict["transient"]:
        lines.append(f"Short-lived processes seen in the window (not judged): {verdict['transient']}")
    return "\n".join(lines)


def plot(samples: list[dict], start: float, path: Path) -> None:
    """RSS and open fds of each process over time, and Redis's used_memory; the judged window shaded."""
    series: dict[str, list[tuple[float, int, int]]] = {}
    for sample in samples:
        for pid, p in sample["processes"].items():
            series.setdefault(f"{p['label']} ({pid})", []).append((sample["t"] / 60, p["rss_kib"], p["fds"]))
    lasting = {name: points for name, points in series.items() if len(points) > 2}  # not each Deno sandbox
    figure = Figure(figsize=(11, 10), layout="constrained")
    rss, fds, memory = figure.subplots(3, 1, sharex=True)
    for name, points in sorted(lasting.items()):
        minutes = [t for t, _, _ in points]
        rss.plot(minutes, [kib / 1024 for _, kib, _ in points], label=name)
        fds.plot(minutes, [n for _, _, n in points], label=name)
    memory.plot([s["t"] / 60 for s in samples], [s["redis_used_memory"] / MIB for s in samples], color="tab:red")
    for axes, title in ((rss, "RSS (MiB)"), (fds, "open file descriptors"), (memory, "Redis used_memory (MiB)")):
        axes.axvspan(start / 60, samples[-1]["t"] / 60, color="0.93", zorder=0)
        axes.set_ylabel(title)
        axes.grid(alpha=0.3)
    rss.set_title("Soak: every process the soak started (shaded: the judged window)")
    rss.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1))
    memory.set_xlabel("minutes")
    figure.savefig(path, dpi=90)


def environment(database_url: str, redis_url: str) -> dict[str, str]:
    """What every process of the soak reads: one database, one Redis, the Celery executor, the loopback
    specialist allowed through the egress guard, one set of keys (those in var/, or the caller's)."""
    env = dict(os.environ) | {"DATABASE_URL": database_url, "REDIS_URL": redis_url, "GATEWAY_EXECUTOR": "celery"}
    env |= {"DJANGO_SETTINGS_MODULE": "gateway_project.settings", "GATEWAY_EGRESS_ALLOWED_NETWORKS": "127.0.0.1/32"}
    env.setdefault("LOG_LEVEL", "WARNING")
    return env


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--clients", type=int, default=4, help="concurrent sessions, alternating the two eras")
    parser.add_argument("--rate", type=float, default=16.0, help="operations per second, all clients together")
    parser.add_argument("--session-ops", type=int, default=200, help="operations before a client reconnects")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/soak.json")
    parser.add_argument("--png", type=Path, default=ROOT / "docs/img/soak.png")
    args = parser.parse_args()
    if not args.database_url.startswith("postgres"):
        parser.error("--database-url (or DATABASE_URL) must name a PostgreSQL database of the soak's own")
    logs = args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    revision = revision_of_tree()  # before the run: what its processes loaded, whatever is committed meanwhile
    database_ensure(args.database_url)
    store_server, redis_url = redis_start(logs)
    started: dict[str, servers.Running] = {"redis": store_server}
    try:
        env = environment(args.database_url, redis_url)
        os.environ.update(env | {"GATEWAY_EXECUTOR": "inline"})  # this process syncs the catalog itself
        keys = data_setup(args.clients)
        from django.conf import settings

        env["GATEWAY_DELEGATION_KEYS"] = settings.GATEWAY_DELEGATION_KEYS  # the specialist's to verify with
        started |= processes_start(env, logs)
        specialist_setup(started["specialist"].url)
        roots = {role: running.process.pid for role, running in started.items()}
        store = redis.Redis.from_url(redis_url)
        result = asyncio.run(soak(args, started["gateway"].url, keys, roots, store))
    finally:
        for running in reversed(started.values()):
            running.stop()
    return report(args, result, revision)


def revision_of_tree() -> str:
    """HEAD's short hash, with `+changes` when tracked files differ from it (other work in a shared tree)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return head + ("+changes" if changed.stdout.strip() else "")


def report(args: argparse.Namespace, result: dict, revision: str) -> int:
    samples = result["samples"]
    window_from = samples[-1]["t"] / 3
    verdict = judge(samples, window_from)
    judged = args.minutes >= MIN_JUDGED_MINUTES
    run = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    document = {"run": run | {"revision": revision}, **result, "verdict": verdict, "judged": judged}
    args.out.write_text(json.dumps(document, indent=1))
    plot(samples, window_from, args.png)
    print(f"operations done {result['done']}, failed {result['failed']}")
    for error in result["errors"]:
        print(f"  {error}")
    print(f"\nOver the last two thirds ({window_from / 60:.1f} to {samples[-1]['t'] / 60:.1f} min):\n")
    print(table(verdict))
    if not judged:
        print(f"\n(not judged: the bars apply to runs of {MIN_JUDGED_MINUTES:.0f} minutes or more)")
    return 1 if result["failed"] or (judged and not verdict["ok"]) else 0


if __name__ == "__main__":
    sys.exit(main())
