"""Soak (docs/reliability.md, "Soak"): a gateway in one of the modes a deployment runs, driven at a steady rate
for `--minutes` by clients of every kind it serves, each starting a new session (or socket) every few dozen
operations, while every process's memory is sampled.

Modes (`--modes`): `embedded` (the default deployment: SQLite, no Redis, the inline executor), `inline`
(PostgreSQL and Redis, the inline executor: the web process runs the upstream pool), `celery` (PostgreSQL and
Redis, a Celery worker runs the pool); each under Daphne or uvicorn (`--servers`). Upstreams: the demo stdio
server, `mcp-server-time`, the example handoff specialist; code mode on. Clients (`--clients`): SDK clients in
2025-11-25 sessions (`legacy`), SDK clients in the stateless 2026-07-28 era (`stateless`) and JSON-RPC clients on
/mcp/ws (`ws`), each an agent of its own, cycling bench/soak_clients.py's MIX (an echo of a random text, a 50 ms
sleep, the time, tools/list, code-mode executions, a handoff round trip).

Every `--every` seconds it samples the RSS and open file descriptors of every process the soak started (the
gateway, the worker and their children: the stdio upstreams and each Deno sandbox, the specialist, Redis) and
Redis's `used_memory`, and judges the last two thirds of the run (bench/soak_judge.py). With Redis, it also
counts Redis's keys before the load and after it, until the sessions' idle window (`--idle-seconds`) has passed:
the keys of ended sessions must be gone by then. It exits non-zero when an operation failed or a bar does not hold.
`--trace` runs the web process under tracemalloc and says what its Python heap grew by between the first
snapshot after warm-up and the last (bench/traced.py); `--trace worker` does so for the Celery worker instead,
`--trace gateway,worker` for both. With each snapshot, malloc's own figures (mallinfo2, smaps_rollup): what the
process holds beyond what Python allocated.

More than one mode or server: each combination runs in turn, in a process of its own, writing
bench/results/soak-<mode>-<server>.json and docs/img/soak-<mode>-<server>.png.

    bench/run soak                      # every mode under both servers, 30 minutes each (see bench/run)
    bench/run soak --modes inline --servers daphne --minutes 10 --trace
    bench/run soak --modes celery --servers daphne --minutes 30 --trace worker
    bench/run soak --clients ws:3 --modes inline --servers daphne --minutes 5
"""

import argparse
import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.soak_clients import DOMAIN, KINDS, Pace, Tally, client_drive, ready_wait  # noqa: E402
from bench.soak_judge import MIB, judge, plot, table  # noqa: E402
from bench.traced import growth, growth_table, traced_command, traced_malloc, traced_snapshot  # noqa: E402
from tests import servers  # noqa: E402  (the process helpers the tests use)

DEMO = [sys.executable, str(ROOT / "examples/demo_upstream.py")]
CLOCK = [str(Path(sys.executable).parent / "mcp-server-time"), "--local-timezone", "UTC"]
AGENT_PREFIX = "soak-"
MODES = ["embedded", "inline", "celery"]
TRACEABLE = ["gateway", "worker"]
SERVERS = ["daphne", "uvicorn"]
MIN_JUDGED_MINUTES = 10.0
WARM_UP_SECONDS = 120.0  # the first snapshot under --trace: the process has made every kind of object by then
# After the load, Redis's keys are counted until the idle window and two sweeps of the reaper have passed.
REAP_SECONDS = 60.0
RATE_WINDOW_SECONDS = 61.0  # the rate limits' windows (policy/limits/stores.py) outlive their last call by this
# A key's kind: its name with each id (hex, digits, a session's) made a star, so the count by kind says what is left.
ID = re.compile(rb"[0-9a-f]{8,}|ws-[0-9a-f]+|\d+")


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
    """A migrated database with the demo and time upstreams and one agent per client; returns their keys.
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
    Upstream.objects.filter(slug__in=["demo", "time", DOMAIN]).delete()
    if connection.vendor == "postgresql":  # an embedded run starts from a fresh SQLite file
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE audit_auditevent, audit_auditcheckpoint")
    unlimited = 10**9  # limits on, as in production, set high enough never to trip
    for slug, command in (("demo", DEMO), ("time", CLOCK)):
        upstream = Upstream(slug=slug, transport="stdio", command=command[0], args=command[1:])
        upstream.calls_per_minute = unlimited
        upstream_save(upstream=upstream, created=True)
        assert upstream_catalog_sync(upstream=upstream).ok, slug
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


def gateway_start(server: str, env: dict[str, str], log: Path, trace: Path | None) -> servers.Running:
    """The web process under `server`, as deployed (tests/servers.py's commands), or under tracemalloc."""
    port = servers.free_port()
    app = "gateway_project.asgi:application"
    if server == "daphne":
        arguments = ["-b", "127.0.0.1", "-p", str(port), app]
    else:
        arguments = [*servers.UVICORN[3:], "--host", "127.0.0.1", "--port", str(port), app]
    command = traced_command(server, arguments) if trace else [sys.executable, "-m", server, *arguments]
    running = servers.Running(servers.start(command, env | ({"TRACE_OUT": str(trace)} if trace else {}), log), log)
    try:
        servers.wait_for_port(port, running.process, log)
    except RuntimeError:
        running.stop()  # not left serving after the soak gave up on it
        raise
    running.url = f"http://127.0.0.1:{port}"
    return running


def worker_start(env: dict[str, str], log: Path, trace: Path | None) -> servers.Running:
    """The Celery worker as deployed (scripts/worker: under jemalloc where installed), or under tracemalloc (and
    glibc's malloc)."""
    if trace is None:
        return servers.start_worker(env, log)
    return servers.start_worker(
        env | {"TRACE_OUT": str(trace)}, log, launcher=traced_command("celery", [*servers.CELERY[3:], "worker"])
    )


def trace_out(logs: Path, role: str, trace: list[str]) -> Path | None:
    """Where a traced process writes its snapshots (`soak-trace.<n>` for the gateway), or None if it is not."""
    return logs / ("soak-trace" if role == "gateway" else f"soak-{role}-trace") if role in trace else None


def processes_start(mode: str, server: str, env: dict[str, str], logs: Path, trace: list[str]) -> dict:
    worker = worker_start(env, logs / "soak-worker.log", trace_out(logs, "worker", trace)) if mode == "celery" else None
    started = {"worker": worker} if worker is not None else {}
    gateway = gateway_start(server, env, logs / "soak-gateway.log", trace_out(logs, "gateway", trace))
    specialist = servers.start_specialist(DOMAIN, env, gateway.url, logs / "soak-specialist.log")
    return started | {"gateway": gateway, "specialist": specialist}


# Sampling: each server started here and its descendants (a worker's stdio upstream, each Deno sandbox), walked
# by parent pid: the pool starts an upstream in a process session of its own.


def command_name(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    script = next((a for a in argv[1:] if a.endswith(b".py")), None)
    if script is None and Path(argv[0].decode(errors="replace")).name.startswith("python") and len(argv) > 1:
        script = argv[1]  # a console script (mcp-server-time) run by the interpreter
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


def process_measure(pid: int) -> tuple[int, int, int] | None:
    """(VmRSS in KiB, open file descriptors, threads), or None for a process that is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields:  # a zombie
        return None
    return int(fields["VmRSS"].split()[0]), fds, int(fields["Threads"])


def sample_take(roots: dict[str, int], store: redis.Redis | None, started: float, done: int) -> dict:
    measured = {}
    for pid, label in processes_find(roots).items():
        if (measure := process_measure(pid)) is not None:
            rss, fds, threads = measure
            measured[str(pid)] = {"label": label, "rss_kib": rss, "fds": fds, "threads": threads}
    memory = store.info("memory")["used_memory"] if store is not None else None
    return {"t": time.monotonic() - started, "operations": done, "processes": measured, "redis_used_memory": memory}


def key_kind(key: bytes) -> str:
    """A key's name with its ids starred: `sb:mcp-ended:*`."""
    return ID.sub(b"*", key).decode(errors="replace")


def keys_count(store: redis.Redis) -> Counter:
    """Redis's keys by kind."""
    return Counter(key_kind(key) for key in store.scan_iter(count=1000))


async def keys_settle(store: redis.Redis, before: Counter, idle: float, wait: bool) -> dict:
    """Redis's keys after the load, polled (if `wait`) until their count is back to `before`'s or the idle window,
    two of the reaper's sweeps and the rate windows have passed: what is left then (by kind, above its count
    before) outlived its session."""
    at_end = keys_count(store)
    bound = max(idle + 2 * min(REAP_SECONDS, max(0.5, idle / 4)), RATE_WINDOW_SECONDS) + 30 if wait else 0
    deadline = time.monotonic() + bound
    while (after := keys_count(store)).total() > before.total() and time.monotonic() < deadline:
        await asyncio.sleep(2)
    left = {kind: n - before[kind] for kind, n in after.items() if n > before[kind]}
    waited = time.monotonic() - deadline + bound
    return {
        "before": before.total(),
        "at_end": at_end.total(),
        "after": after.total(),
        "waited_seconds": round(waited, 1),
        "left_by_kind": left,
        "ok": after.total() <= before.total(),
    }


# The run.


def clients_parse(text: str) -> list[str]:
    """`legacy:2,stateless:2,ws:1` as one kind per client."""
    kinds = []
    for part in text.split(","):
        kind, _, count = part.partition(":")
        if kind not in KINDS:
            raise argparse.ArgumentTypeError(f"{kind!r} is not a kind of client ({', '.join(KINDS)})")
        kinds += [kind] * int(count or 1)
    return kinds


async def soak(args: argparse.Namespace, url: str, keys: list[str], roots: dict[str, int], store) -> dict:
    await ready_wait(url, keys[0])
    keys_before = keys_count(store) if store is not None else None
    tally, samples = Tally(), []
    started = time.monotonic()
    pace = Pace(interval=len(keys) / args.rate, deadline=started + args.minutes * 60, session_ops=args.session_ops)
    drives = [
        client_drive(url, key, kind, pace, tally, n * 7)
        for n, (key, kind) in enumerate(zip(keys, args.clients, strict=True))
    ]
    clients = asyncio.gather(*drives)
    snapshots: dict[str, list] = {role: [] for role in args.trace}
    next_snapshot = started + WARM_UP_SECONDS
    while not clients.done():
        samples.append(sample_take(roots, store, started, sum(tally.done.values())))
        print(f"{samples[-1]['t'] / 60:5.1f} min  {dict(tally.done)}  failed {dict(tally.failed)}", file=sys.stderr)
        if args.trace and time.monotonic() >= next_snapshot:
            await traces_take(args, roots, snapshots)
            next_snapshot += args.trace_every
        await asyncio.wait([clients], timeout=args.every)
    await clients
    samples.append(sample_take(roots, store, started, sum(tally.done.values())))
    await traces_take(args, roots, snapshots)
    result = {"samples": samples, "done": dict(tally.done), "failed": dict(tally.failed), "errors": tally.errors}
    if keys_before is not None:
        judged = args.minutes >= MIN_JUDGED_MINUTES  # a short run does not wait for the keys either
        result["redis_keys"] = await keys_settle(store, keys_before, args.idle_seconds, judged)
    traces = {role: trace_report(role, taken[0], taken[-1]) for role, taken in snapshots.items() if len(taken) >= 2}
    if traces:
        result["trace"] = traces
    return result


async def traces_take(args: argparse.Namespace, roots: dict[str, int], snapshots: dict[str, list]) -> None:
    """A snapshot of each traced process, with the sample of its malloc taken with it."""
    for role, taken in snapshots.items():
        path = Path(f"{trace_out(args.out.parent, role, args.trace)}.{len(taken) + 1}")
        # A snapshot of a big heap with deep tracebacks takes a while.
        await asyncio.to_thread(traced_snapshot, roots[role], path, 300)
        taken.append((time.monotonic(), path))


def trace_report(role: str, first: tuple[float, Path], last: tuple[float, Path]) -> dict:
    import tracemalloc

    minutes = (last[0] - first[0]) / 60
    per_owner, per_line = growth(tracemalloc.Snapshot.load(str(first[1])), tracemalloc.Snapshot.load(str(last[1])))
    top = dict(sorted(per_line.items(), key=lambda item: -item[1])[:40])
    heap = sum(per_owner.values()) / MIB
    print(f"\n{role}: Python heap growth under tracemalloc over {minutes:.1f} min: {heap:.2f} MiB\n")
    malloc = [traced_malloc(first[1]), traced_malloc(last[1])]
    names = (
        "traced",
        "tracemalloc_own",
        "uordblks",
        "fordblks",
        "hblkhd",
        "arena",
        "smaps_Rss_kib",
        "smaps_Anonymous_kib",
    )
    for name in names:
        scale = 1 if name.endswith("_kib") else 1024
        values = [figures.get(name, 0) / scale / 1024 for figures in malloc]
        print(f"malloc {name}: {values[0]:.2f} -> {values[1]:.2f} MiB ({values[1] - values[0]:+.2f})")
    for title, sizes in (("package", per_owner), ("line", per_line)):
        print("\n" + growth_table(sizes, title, max(1, round(minutes)), "minute", top=20))
    return {"minutes": minutes, "by_package": dict(per_owner), "by_line": top, "malloc": malloc}


def environment(mode: str, database_url: str, redis_url: str, var_dir: str, idle: float) -> dict[str, str]:
    """What every process of the soak reads: the mode's database, Redis and executor, the loopback specialist
    allowed through the egress guard, one set of keys (those in the var dir), the sessions' idle window."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "GATEWAY_EXECUTOR")}
    env |= {"DJANGO_SETTINGS_MODULE": "gateway_project.settings", "GATEWAY_EGRESS_ALLOWED_NETWORKS": "127.0.0.1/32"}
    # A stateless caller's call counter lasts its window: the same as a session's idle time here.
    env |= {"GATEWAY_SESSION_IDLE_SECONDS": str(idle), "GATEWAY_STATELESS_WINDOW_SECONDS": str(round(idle))}
    env["GATEWAY_EXECUTOR"] = "celery" if mode == "celery" else "inline"
    if mode == "embedded":
        env["SWITCHBOARD_VAR_DIR"] = var_dir
    else:
        env |= {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
    env.setdefault("LOG_LEVEL", "WARNING")
    return env


def run_one(args: argparse.Namespace, mode: str, server: str) -> int:
    servers.START_TIMEOUT = 120.0  # on a loaded machine a gateway may take over 30 s to listen: wait, not fail
    logs = args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    revision = revision_of_tree()  # before the run: what its processes loaded, whatever is committed meanwhile
    for stale in logs.glob("soak-*trace.*"):  # a snapshot of an earlier run would be taken for this one's
        stale.unlink()
    started: dict[str, servers.Running] = {}
    redis_url, store = "", None
    if mode != "embedded":
        database_ensure(args.database_url)
        started["redis"], redis_url = redis_start(logs)
        store = redis.Redis.from_url(redis_url)
    with tempfile.TemporaryDirectory(prefix="soak-var-", dir=logs) as var_dir:  # embedded: SQLite and keys
        try:
            env = environment(mode, args.database_url, redis_url, var_dir, args.idle_seconds)
            for name in ("DATABASE_URL", "REDIS_URL"):  # embedded: this process's data goes to the gateway's SQLite
                os.environ.pop(name, None)
            os.environ.update(env | {"GATEWAY_EXECUTOR": "inline"})  # this process syncs the catalog itself
            keys = data_setup(len(args.clients))
            from django.conf import settings

            env["GATEWAY_DELEGATION_KEYS"] = settings.GATEWAY_DELEGATION_KEYS  # the specialist's to verify with
            started |= processes_start(mode, server, env, logs, args.trace)
            specialist_setup(started["specialist"].url)
            roots = {role: running.process.pid for role, running in started.items()}
            result = asyncio.run(soak(args, started["gateway"].url, keys, roots, store))
        finally:
            for running in reversed(started.values()):
                running.stop()
    return report(args, result, revision | {"mode": mode, "server": server})


def run_each(args: argparse.Namespace, argv: list[str]) -> int:
    """Each mode under each server in turn, each in a process of its own (Django is set up once per process)."""
    failed = []
    for mode, server in itertools.product(args.modes, args.servers):
        out = args.out.with_name(f"soak-{mode}-{server}.json")
        png = args.png.with_name(f"soak-{mode}-{server}.png")
        command = [sys.executable, __file__, *argv, "--modes", mode, "--servers", server]
        command += ["--out", str(out), "--png", str(png)]
        print(f"\n## {mode} under {server}\n", flush=True)
        if subprocess.run(command, cwd=ROOT).returncode != 0:
            failed.append(f"{mode} under {server}")
    print(f"\n{'every run held its bars' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if failed else 0


def without(argv: list[str], options: set[str]) -> list[str]:
    """`argv` without the `options` given and their values (`--out x` or `--out=x`)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        elif arg.split("=", 1)[0] not in options:
            kept.append(arg)
    return kept


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--modes", type=lambda text: text.split(","), default=MODES, help=", ".join(MODES))
    parser.add_argument("--servers", type=lambda text: text.split(","), default=SERVERS, help=", ".join(SERVERS))
    parser.add_argument("--clients", type=clients_parse, default=clients_parse("legacy:2,stateless:2,ws:1"))
    parser.add_argument("--rate", type=float, default=20.0, help="operations per second, all clients together")
    parser.add_argument("--session-ops", type=int, default=40, help="operations before a client starts over")
    parser.add_argument("--idle-seconds", type=float, default=120.0, help="GATEWAY_SESSION_IDLE_SECONDS")
    parser.add_argument(
        "--trace",
        nargs="?",
        const=["gateway"],
        default=[],
        type=lambda text: text.split(","),
        help="these processes under tracemalloc (gateway, worker; alone: the gateway)",
    )
    parser.add_argument("--trace-every", type=float, default=120.0, help="seconds between snapshots")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/soak.json")
    parser.add_argument("--png", type=Path, default=ROOT / "docs/img/soak.png")
    argv = sys.argv[1:]
    args = parser.parse_args()
    unknown = set(args.modes) - set(MODES) | set(args.servers) - set(SERVERS) | set(args.trace) - set(TRACEABLE)
    if unknown:
        parser.error(f"unknown mode, server or traced process: {', '.join(sorted(unknown))}")
    if "worker" in args.trace and set(args.modes) != {"celery"}:
        parser.error("--trace worker: only the celery mode has a worker")
    if set(args.modes) != {"embedded"} and not args.database_url.startswith("postgres"):
        parser.error("--database-url (or DATABASE_URL) must name a PostgreSQL database of the soak's own")
    if len(args.modes) * len(args.servers) > 1:
        return run_each(args, without(argv, {"--modes", "--servers", "--out", "--png"}))
    return run_one(args, args.modes[0], args.servers[0])


def revision_of_tree() -> dict:
    """HEAD's short hash, with `+changes` when tracked files differ from it (other work in a shared tree)."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return {"revision": head + ("+changes" if changed.stdout.strip() else "")}


def report(args: argparse.Namespace, result: dict, run_of: dict) -> int:
    samples = result["samples"]
    window_from = samples[-1]["t"] / 3
    verdict = judge(samples, window_from)
    judged = args.minutes >= MIN_JUDGED_MINUTES
    run = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    document = {"run": run | run_of, **result, "verdict": verdict, "judged": judged}
    args.out.write_text(json.dumps(document, indent=1))
    plot(samples, window_from, args.png)
    print(f"{run_of['mode']} under {run_of['server']}: operations done {result['done']}, failed {result['failed']}")
    for error in result["errors"]:
        print(f"  {error}")
    print(f"\nOver the last two thirds ({window_from / 60:.1f} to {samples[-1]['t'] / 60:.1f} min):\n")
    print(table(verdict))
    keys = result.get("redis_keys")
    if keys is not None:
        print(
            f"Redis keys: {keys['before']} before the load, {keys['at_end']} at its end, {keys['after']} "
            f"{keys['waited_seconds']:.0f} s later: {('holds' if keys['ok'] else 'FAILS') if judged else 'not judged'} "
            f"{keys['left_by_kind'] or ''}"
        )
    if not judged:
        print(f"\n(not judged: the bars apply to runs of {MIN_JUDGED_MINUTES:.0f} minutes or more)")
    held = verdict["ok"] and (keys is None or keys["ok"])
    return 1 if result["failed"] or (judged and not held) else 0


if __name__ == "__main__":
    sys.exit(main())
