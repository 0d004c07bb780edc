"""What calls waiting for sign-off cost a web process (issue 37's bar: a waiting call holds no thread and no database
connection; 1,000 pending requests cost one web process <= 50 MiB).

One gateway under Daphne on PostgreSQL and Redis (bench/run's environment, inline executor), a sign_off rule on the
bench agent's `demo__add`. In one run, after a warm-up (sessions, pending calls, a few held calls refused):

- idle:    N raw 2025-11-25 sessions opened (as bench/idle_sessions.py), nothing held;
- pending: N 2026-07-28 calls, each with other arguments, answered -32003 SIGNOFF_PENDING at once: N rows;
- held:    each of the N sessions makes one tools/call with other arguments, which the gateway holds
           (GATEWAY_SIGN_OFF_HOLD_SECONDS 1800); read once all N requests are rows;
- released: every held request refused through policy.sign_off (as an approver would), each call answered
           SIGNOFF_REFUSED, its connection closed.

At each step: the Daphne process's VmRSS once settled, its threads (/proc/<pid>/task), its TCP connections to
PostgreSQL and Redis (its sockets in /proc/<pid>/fd), and those PostgreSQL backends' states (pg_stat_activity by
client port). GATEWAY_SIGN_OFF_PENDING_PER_CALLER is raised so that one agent may have all of them pending, and
GATEWAY_MAX_IN_FLIGHT (256) above 2N: a held call is a POST in flight. Held calls start --concurrency at a time,
the next once the last are rows.

`--server uvicorn` measures the gateway under uvicorn instead (the attribution stays under Daphne).
`--attribute M` then holds M calls on a second gateway under tracemalloc and says which code's allocations the
Python heap grew by.

    bench/run sign_off_waits [--calls 1000] [--concurrency 50] [--attribute 1000] [--server uvicorn]
"""

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.idle_sessions import ACCEPT, MIB, VERSION, WARMUP, open_session, settled_rss  # noqa: E402
from bench.run import setup_database  # noqa: E402
from bench.traced import growth_report, traced_gateway, traced_malloc, traced_snapshot  # noqa: E402
from tests import servers  # noqa: E402
from tests.clients import reply_of, stateless_body, stateless_headers  # noqa: E402

TOOL = "demo__add"
HELD, PENDING, WARM_PENDING, WARM_HELD = 0, 1, 2, 3  # the `b` argument of each kind of call: rows told apart
WARM_HELD_CALLS = 5
HOLD_SECONDS = 1800  # longer than the run: every held call is still held when read
ROWS_BOUND = 600.0  # seconds for all held calls to become rows, and to be answered once refused
PORTS = {"postgresql": 5432, "redis": 6379}


def rule_setup() -> object:
    """A sign_off rule on the bench agent's `add`, signed off by the console group bench-signers; its member."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from audit.models import DEFAULT_TEAM
    from policy.models import Agent, Rule, Team, TeamMember
    from registry.models import Upstream

    group, _ = Group.objects.get_or_create(name="bench-signers")
    signer, _ = get_user_model().objects.get_or_create(username="bench-signer")
    signer.groups.add(group)
    TeamMember.objects.get_or_create(team=Team.objects.get(slug=DEFAULT_TEAM), user=signer, defaults={"role": "member"})
    Rule.objects.filter(signers=group).delete()
    agent, demo = Agent.objects.get(name="bench"), Upstream.objects.get(slug="demo")
    Rule.objects.create(effect="sign_off", agent=agent, upstream=demo, tool_pattern="add", signers=group)
    return signer


def pending_ids(kind: int) -> list[str]:
    from policy.models import SignOff

    found = SignOff.objects.filter(agent__name="bench", state="pending", arguments__b=kind)
    return [str(ident) for ident in found.values_list("id", flat=True)]


def refuse_all(signer: object, kind: int) -> int:
    from policy.sign_off import sign_off_decide

    idents = pending_ids(kind)
    for ident in idents:
        sign_off_decide(sign_off_id=ident, user=signer, grant=False, reason="The bench is done with it.")
    return len(idents)


def sockets_to(pid: int) -> dict[str, set[int]]:
    """This process's TCP connections to PostgreSQL and Redis, by the local port of each."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found: dict[str, set[int]] = {name: set() for name in PORTS}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if inode not in inodes or state != "01":  # 01: established
                continue
            for name, port in PORTS.items():
                if int(remote.rsplit(":", 1)[1], 16) == port:
                    found[name].add(int(local.rsplit(":", 1)[1], 16))
    return found


def backend_states(ports: set[int]) -> dict[str, int]:
    """The states of the PostgreSQL backends serving these client ports: `idle` is a pooled connection, no more."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(state, ''), count(*) FROM pg_stat_activity WHERE client_port = ANY(%s) GROUP BY 1",
            [list(ports)],
        )
        return dict(cursor.fetchall())


def reading(step: str, pid: int) -> dict:
    rss = settled_rss(pid)
    sockets = sockets_to(pid)
    row = {
        "step": step,
        "rss": rss,
        "threads": len(list(Path(f"/proc/{pid}/task").iterdir())),
        "postgresql": len(sockets["postgresql"]),
        "backends": backend_states(sockets["postgresql"]),
        "redis": len(sockets["redis"]),
    }
    print(
        f"{step:9} RSS {rss / MIB:.1f} MiB, {row['threads']} threads, {row['postgresql']} PostgreSQL connections "
        f"{row['backends']}, {row['redis']} Redis",
        file=sys.stderr,
    )
    return row


async def open_sessions(http: httpx2.AsyncClient, url: str, count: int, concurrency: int) -> list[str]:
    gate = asyncio.Semaphore(concurrency)

    async def one(number: int) -> str:
        async with gate:
            return await open_session(http, url, number)

    return await asyncio.gather(*(one(number) for number in range(count)))


async def held_call(http: httpx2.AsyncClient, url: str, session_id: str, arguments: dict) -> dict:
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": TOOL, "arguments": arguments}}
    headers = {"mcp-session-id": session_id, "mcp-protocol-version": VERSION}
    try:
        answer = await http.post(url, json=body, headers=headers)
    except httpx2.HTTPError as failed:  # counted with the answers, as what the call got
        return {"error": {"data": {"code": type(failed).__name__}}}
    if answer.status_code != 200:
        return {"error": {"data": {"code": f"HTTP {answer.status_code}"}}}
    return reply_of(answer)


async def pending_calls(url: str, key: str, count: int, kind: int, concurrency: int) -> Counter:
    """`count` 2026-07-28 calls, each with other arguments; the codes they were answered with."""
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    gate, headers = asyncio.Semaphore(concurrency), stateless_headers(key, TOOL)
    async with httpx2.AsyncClient(limits=limits, timeout=60) as http:

        async def one(number: int) -> str:
            async with gate:
                body = stateless_body(TOOL, {"a": number, "b": kind})
                reply = reply_of(await http.post(url, content=body, headers=headers))
                return (reply.get("error", {}).get("data") or {}).get("code", "answered")

        return Counter(await asyncio.gather(*(one(number) for number in range(count))))


async def rows_awaited(kind: int, count: int, calls: list[asyncio.Task]) -> float:
    """Seconds until `count` requests of this kind are pending rows; none of their calls may have been answered."""
    started = time.monotonic()
    while len(await asyncio.to_thread(pending_ids, kind)) < count:
        answered = [task.result() for task in calls if task.done()]
        if answered:
            raise RuntimeError(f"{len(answered)} calls answered instead of held, the first: {answered[0]}")
        if time.monotonic() - started > ROWS_BOUND:
            raise RuntimeError(f"not {count} pending requests within {ROWS_BOUND} s")
        await asyncio.sleep(0.5)  # a poll interval, bounded by ROWS_BOUND
    return time.monotonic() - started


async def hold(http: httpx2.AsyncClient, url: str, sessions: list[str], kind: int, batch: int) -> list[asyncio.Task]:
    """One call on each session, `batch` at a time: the next once the last are held (rows). All at once, a
    thousand calls would need more Redis connections at the same moment than the pool's 100 (redis-py's
    default), and some would be answered 503 before they are asked for."""
    held: list[asyncio.Task] = []
    for first in range(0, len(sessions), batch):
        for n, session_id in enumerate(sessions[first : first + batch], start=first):
            held.append(asyncio.create_task(held_call(http, url, session_id, {"a": n, "b": kind})))
        await rows_awaited(kind, len(held), held)
    return held


async def release(signer: object, kind: int, calls: list[asyncio.Task]) -> Counter:
    """Refuse every held request of this kind; the codes their calls were answered with."""
    await asyncio.to_thread(refuse_all, signer, kind)
    replies = await asyncio.wait_for(asyncio.gather(*calls), ROWS_BOUND)
    return Counter((reply.get("error", {}).get("data") or {}).get("code", "answered") for reply in replies)


def session_client(key: str, connections: int) -> httpx2.AsyncClient:
    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections)
    headers = {"Authorization": f"Bearer {key}", "Accept": ACCEPT}
    return httpx2.AsyncClient(headers=headers, limits=limits, timeout=HOLD_SECONDS + 60)


async def warm_up(http: httpx2.AsyncClient, url: str, key: str, signer: object, concurrency: int) -> None:
    """The first sessions, pending requests and held calls start the process's tasks and fill its caches."""
    sessions = await open_sessions(http, url, WARMUP, concurrency)
    answers = await pending_calls(url, key, WARMUP, WARM_PENDING, concurrency)
    assert answers == {"SIGNOFF_PENDING": WARMUP}, answers
    held = await hold(http, url, sessions[:WARM_HELD_CALLS], WARM_HELD, concurrency)
    assert (await release(signer, WARM_HELD, held)) == {"SIGNOFF_REFUSED": WARM_HELD_CALLS}


async def measure(url: str, key: str, pid: int, signer: object, calls: int, concurrency: int) -> dict:
    async with session_client(key, calls + WARMUP) as http:
        await warm_up(http, url, key, signer, concurrency)
        sessions = await open_sessions(http, url, calls, concurrency)
        rows = [await asyncio.to_thread(reading, "idle", pid)]
        answers = await pending_calls(url, key, calls, PENDING, concurrency)
        assert answers == {"SIGNOFF_PENDING": calls}, answers
        rows.append(await asyncio.to_thread(reading, "pending", pid))
        started = time.monotonic()
        held = await hold(http, url, sessions, HELD, concurrency)
        seconds = time.monotonic() - started
        print(f"{calls} held calls were rows within {seconds:.1f} s", file=sys.stderr)
        rows.append(await asyncio.to_thread(reading, "held", pid))
        assert not any(task.done() for task in held), "a held call was answered while read"
        started = time.monotonic()
        refused = await release(signer, HELD, held)
        print(f"refused and answered in {time.monotonic() - started:.1f} s: {dict(refused)}", file=sys.stderr)
        assert refused == {"SIGNOFF_REFUSED": calls}, refused
    rows.append(await asyncio.to_thread(reading, "released", pid))
    return {"calls": calls, "rows": rows}


def table(result: dict) -> str:
    calls, (idle, pending, held, released) = result["calls"], result["rows"]
    lines = [
        "| step | web RSS MiB | growth MiB | KiB a call | threads | PostgreSQL connections (backend states) | Redis |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for row, before in ((idle, None), (pending, idle), (held, pending), (released, held)):
        grown = "" if before is None else f"{(row['rss'] - before['rss']) / MIB:+.1f}"
        per = "" if before is None else f"{(row['rss'] - before['rss']) / calls / 1024:+.1f}"
        states = ", ".join(f"{count} {state}" for state, count in sorted(row["backends"].items()))
        lines.append(
            f"| {row['step']} | {row['rss'] / MIB:.1f} | {grown} | {per} | {row['threads']} "
            f"| {row['postgresql']} ({states}) | {row['redis']} |"
        )
    return "\n".join(lines)


def gateway_env(calls: int) -> dict[str, str]:
    return dict(os.environ) | {
        "GATEWAY_EXECUTOR": "inline",
        "GATEWAY_MAX_LEGACY_SESSIONS": str(4 * calls + 10 * WARMUP),
        "GATEWAY_MAX_SESSIONS_PER_AGENT": str(4 * calls + 10 * WARMUP),  # one agent opens them all
        # A held call is a POST in flight: past GATEWAY_MAX_IN_FLIGHT (256) the process answers 503 to the rest.
        "GATEWAY_MAX_IN_FLIGHT": str(2 * calls + 10 * WARMUP),
        "GATEWAY_SIGN_OFF_HOLD_SECONDS": str(HOLD_SECONDS),
        "GATEWAY_SIGN_OFF_WAIT_SECONDS": str(2 * HOLD_SECONDS),
        "GATEWAY_SIGN_OFF_PENDING_PER_CALLER": "10000",  # its maximum: one agent has every request of the run
    }


async def traced_hold(url: str, key: str, pid: int, signer: object, calls: int, out: Path, concurrency: int) -> tuple:
    async with session_client(key, calls + WARMUP) as http:
        await warm_up(http, url, key, signer, concurrency)
        sessions = await open_sessions(http, url, calls, concurrency)
        before = await asyncio.to_thread(traced_snapshot, pid, Path(f"{out}.1"))
        held = await hold(http, url, sessions, HELD, concurrency)
        after = await asyncio.to_thread(traced_snapshot, pid, Path(f"{out}.2"))
        await release(signer, HELD, held)
    return before, after


def attribute(key: str, signer: object, calls: int, concurrency: int, env: dict[str, str], work: Path) -> None:
    """Python heap growth per held call under tracemalloc, by the package whose code allocated it."""
    from policy.models import SignOff

    SignOff.objects.filter(agent__name="bench").delete()  # else the same arguments are answered as refused before
    gateway, out = traced_gateway(env, work, "sign_off_waits")
    try:
        before, after = asyncio.run(
            traced_hold(f"{gateway.url}/mcp", key, gateway.process.pid, signer, calls, out, concurrency)
        )
    finally:
        gateway.stop()
    print(growth_report(before, after, calls, "held call", top=20))
    print(beyond_python(Path(f"{out}.1"), Path(f"{out}.2"), calls))


def beyond_python(first: Path, second: Path, calls: int) -> str:
    """What the process grew by besides the traced Python heap: malloc's in-use bytes, and RSS."""
    before, after = traced_malloc(first), traced_malloc(second)

    def grown(name: str) -> float:
        return after[name] - before[name]

    own = grown("tracemalloc_own")  # tracemalloc's own traces, in malloc's figures and RSS too
    in_use = grown("uordblks") + grown("hblkhd") - own
    rss = grown("smaps_Rss_kib") * 1024 - own
    return (
        f"Beside it (tracemalloc's own traces taken out): malloc in use +{in_use / MIB:.1f} MiB, "
        f"RSS +{rss / MIB:.1f} MiB ({rss / calls / 1024:.1f} KiB a call)."
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000, help="sessions, pending calls and held calls each")
    parser.add_argument("--concurrency", type=int, default=50, help="connections opening sessions, pending calls")
    parser.add_argument("--attribute", type=int, default=0, help="then hold this many under tracemalloc")
    parser.add_argument("--server", choices=("daphne", "uvicorn"), default="daphne", help="the measured gateway's")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/sign_off_waits.json")
    args = parser.parse_args()
    if 2 * args.calls + args.attribute + 2 * WARMUP > 10_000:
        raise SystemExit("one agent may have at most 10,000 pending requests: fewer calls")
    key = setup_database()
    signer = rule_setup()
    env = gateway_env(max(args.calls, args.attribute))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.out.parent / "sign_off_waits.log"
    if args.server == "uvicorn":
        gateway = servers.start_gateway_under(servers.UVICORN, env, log)
    else:
        gateway = servers.start_gateway(env, log)
    try:
        url, pid = f"{gateway.url}/mcp", gateway.process.pid
        result = asyncio.run(measure(url, key, pid, signer, args.calls, args.concurrency))
    finally:
        gateway.stop()
    args.out.write_text(json.dumps(result, indent=2))
    print(table(result))
    if args.attribute:
        attribute(key, signer, args.attribute, args.concurrency, env, args.out.parent)


if __name__ == "__main__":
    main()
