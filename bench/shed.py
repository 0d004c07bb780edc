"""Load shedding (issue 24, item 4): one web process at ten times its configured capacity, behind each door.

One inline gateway under uvicorn (the production server), PostgreSQL audit and Redis, its capacity set to
`--capacity` POSTs in flight (GATEWAY_MAX_IN_FLIGHT); the demo stdio upstream. `--sessions` measured SDK
client sessions, each in a process of its own, call `demo__echo` at `--rate` calls a second each, on a schedule
(0: back to back), first alone (the unloaded p99), then while a flood of ten times the capacity (`--flood`
clients) runs in another process, one kind at a time; `--rounds` repeats every phase of every design, interleaved:

- capacity: capacity - sessions - 1 clients calling as `calls` does: the load the door admits, no more (what
          admitted calls keep at capacity, without an excess to shed: the reference for the kinds below);
- calls:  10 x capacity raw HTTP clients, each POSTing `tools/call demo__sleep` (0.2 s) back to back, retrying
          after Retry-After (at once with --hostile) when refused: more concurrent calls than the process admits;
- bodies: 10 x capacity clients POSTing 2 MiB bodies (twice GATEWAY_MAX_BODY_BYTES);
- headers: 10 x capacity clients sending 100 KiB of headers;
- slow:   10 x capacity clients that send their headers and then a byte of body every 0.5 s;
- sessions: 10 x capacity clients of another agent sending 2025-11-25 `initialize` back to back and never closing
          a session, against GATEWAY_MAX_SESSIONS_PER_AGENT (1000): past it they are refused 429 with Retry-After
          until the oldest stops counting. Also reported: the session records the flood left in Redis.

A probe in the measuring process sends one call every 50 ms, to see the door as a client outside the flood does.
The flood's clients are in bench/shed_flood.py.

Each design is a door and a placement, and every design runs each phase in turn (unloaded, then each kind), so
that drifts in the shared machine's load fall on all of them alike. Doors (each its own gateway process):

- app:      the gateway's own line alone (handoff/endpoints/http.py: 503, Retry-After, SERVER_BUSY past the cap);
- uvicorn:  the same, under `uvicorn --limit-concurrency` (`--uvicorn-limit`, 4 x capacity by default), which
            answers 503 without waking the app once that many connections or tasks are open;
- app-lag, haproxy-lag: app and haproxy with GATEWAY_MAX_LOOP_LAG_MS (`--lag-ms`): a POST is refused too while
            the process's event loop runs later than that on average (handoff/loop_lag.py);
- haproxy:  HAProxy in front (one server, maxconn = capacity for POSTs; GETs, which are streams, on a backend of
            their own): past the capacity a POST is answered by HAProxy with the gateway's own 503 body and
            Retry-After; bodies over GATEWAY_MAX_BODY_BYTES are refused 413 from their declared length, and a
            request is buffered whole (bounded by GATEWAY_BODY_SECONDS) before it takes a place.

`--before REV` adds the door `before`: the app door running REV's code (git archive, uvicorn --app-dir).

Placements: `shared` (the flood on the gateway's cores at normal priority: the first measurement's set-up),
`niced` (the flood at nice 19), `apart` (the gateway and its upstream pinned to CPU 0; the flood at nice 19,
HAProxy and the measuring client on the others): `apart` stands for a flood that comes from other machines.

Reported per design and kind: how the flood's requests were answered (status counts) and how fast a refusal came
(p50, p99), the probe's, the measured sessions' admitted calls (p99 against the design's unloaded p99) and how many
of theirs were shed, the CPU the door's processes (gateway, HAProxy) and the flood used. Bars (issue 24):
refusals within 50 ms as 429/503 with Retry-After; admitted p99 <= 1.2x unloaded; nothing falls over (the
gateway answers after every kind).

    bench/run shed --capacity 16 --seconds 10      # figures: bench/results/shed.json, the processes' logs beside it
    bench/run shed --doors app,app-lag --placements apart --kinds capacity,calls --seconds 15 --rounds 2
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import http_session, sessions_cpu_seconds, setup_database  # noqa: E402  (bench/run.py: the same data)
from shed_flood import (  # noqa: E402
    GATEWAY_CPU,
    flood,
    pin,
    place,
    session_records,
    sessions_count_reset,
)

from tests import servers  # noqa: E402  (the process helpers the tests use)
from tests.clients import stateless_body, stateless_headers  # noqa: E402

KINDS = ("capacity", "calls", "bodies", "headers", "slow", "sessions")
DOORS = ("app", "uvicorn", "haproxy", "app-lag", "haproxy-lag")
PLACEMENTS = ("shared", "niced", "apart")


async def probe(url: str, key: str, seconds: float) -> list:
    """One request at a time (a call that would be admitted if there were room), as a client that is not part
    of the flood sees the door: (status, seconds, retry-after) each."""
    answers: list = []
    until = time.monotonic() + seconds
    body, headers = stateless_body("demo__echo", {"text": "probe"}), stateless_headers(key, "demo__echo")
    async with httpx2.AsyncClient(timeout=30) as http:
        while time.monotonic() < until:
            started = time.monotonic()
            answer = await http.post(f"{url}/mcp", content=body, headers=headers)
            answers.append((answer.status_code, time.monotonic() - started, answer.headers.get("retry-after")))
            await asyncio.sleep(0.05)  # the probe's pace: it samples the door, it does not add to the flood
    return answers


async def measured(url: str, key: str, sessions: int, seconds: float, rate: float) -> tuple[list[float], int]:
    """`sessions` SDK sessions calling demo__echo for `seconds`: admitted calls' times, and how many were shed.

    At `rate` calls a second each, on a schedule (open loop): a call's time runs from when it was due, so that a
    call held up delays the ones behind it in the figures too (no coordinated omission). With rate 0 they call
    back to back, which is itself a load: two such sessions keep the gateway's core busy alone, so their
    "unloaded" p99 is a saturated process's."""
    times, shed = [], 0
    until = time.monotonic() + seconds
    interval = 1 / rate if rate else 0.0

    async def one() -> None:
        nonlocal shed
        while time.monotonic() < until:
            try:
                async with http_session(f"{url}/mcp", {"Authorization": f"Bearer {key}"}) as client:
                    await client.call_tool("demo__echo", {"text": "first"})  # untimed: the client lists the tools
                    due = time.monotonic()
                    while due < until:
                        await asyncio.sleep(max(0.0, due - time.monotonic()))
                        started = due if interval else time.monotonic()
                        result = await client.call_tool("demo__echo", {"text": "measured"})
                        assert not result.is_error, result
                        times.append(time.monotonic() - started)
                        due = due + interval if interval else time.monotonic()
            except Exception:  # shed (503) while opening the session or on a call: counted, and opened again
                shed += 1
                await asyncio.sleep(0.05)  # pacing before the next try, as Retry-After would ask (and more)

    await asyncio.gather(*(one() for _ in range(sessions)))
    return times, shed


def _measuring(url: str, key: str, seconds: float, rate: float, out: "multiprocessing.Queue") -> None:
    out.put(asyncio.run(measured(url, key, 1, seconds, rate)))


def measured_apart(
    url: str, key: str, args: argparse.Namespace, alongside: Callable[[], Awaitable] | None = None
) -> tuple[list[float], int, Any]:
    """`measured`, each session in a process of its own (where this one is placed), so that one session's client
    work (a new session after a refusal) is not in another's times; `alongside` runs here meanwhile."""
    out: multiprocessing.Queue = multiprocessing.Queue()
    sessions = [
        multiprocessing.Process(target=_measuring, args=(url, key, args.seconds, args.rate, out), daemon=True)
        for _ in range(args.sessions)
    ]
    for session in sessions:
        session.start()
    beside = asyncio.run(alongside()) if alongside else None
    each = [out.get(timeout=args.seconds + 60) for _ in sessions]
    for session in sessions:
        session.join(timeout=30)
    return [t for times, _ in each for t in times], sum(shed for _, shed in each), beside


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else float("nan")


def summary(answers: list) -> dict:
    statuses: dict[str, int] = {}
    for status, _, _ in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    refused = [(s, t, r) for s, t, r in answers if s in (429, 503)]
    refusal_times = [t for _, t, _ in refused]
    others = [t for s, t, _ in answers if s in (400, 408, 413, 431)]
    return {
        "statuses": statuses,
        "refusals": len(refused),
        "refusals_with_retry_after": sum(1 for _, _, r in refused if r),
        "refusal_p50_ms": statistics.median(refusal_times) * 1000 if refusal_times else None,
        "refusal_p99_ms": p99(refusal_times) * 1000 if len(refusal_times) > 1 else None,
        "other_refusals_p50_ms": statistics.median(others) * 1000 if others else None,
        "other_refusals_p99_ms": p99(others) * 1000 if len(others) > 1 else None,
    }


HAPROXY = """global
  maxconn 8192
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  # A request is buffered whole before it takes a place, and must have arrived within GATEWAY_BODY_SECONDS.
  option http-buffer-request
  timeout http-request {body_seconds}s
  # Past maxconn a request waits this long at most for a place, then gets the 503 below.
  timeout queue 20ms
  errorfile 503 {busy_file}
frontend mcp
  bind 127.0.0.1:{port}
  http-request deny deny_status 413 if {{ req.hdr_val(content-length) gt {max_body} }}
  acl full srv_conn(calls/gateway) ge {capacity}
  http-request return status 503 content-type application/json file {busy_body} hdr retry-after 1 if METH_POST full
  use_backend calls if METH_POST
  default_backend streams
backend calls
  server gateway {gateway} maxconn {capacity}
backend streams
  server gateway {gateway}
"""


@dataclass
class Door:
    name: str
    url: str
    running: list = field(default_factory=list)  # what was started for it, gateway first

    def sessions(self) -> set[int]:
        return {r.process.pid for r in self.running}


def busy_body() -> str:
    """The gateway's own answer past its cap, for a door in front of it to send alike."""
    from handoff.endpoints.http import BUSY_BODY  # needs Django's settings, set up by setup_database

    return BUSY_BODY


def start_haproxy(
    name: str, gateway: servers.Running, args: argparse.Namespace, env: dict[str, str], logs: Path
) -> servers.Running:
    from django.conf import settings

    body = busy_body()
    (logs / "shed-busy.json").write_text(body)
    head = "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
    (logs / "shed-busy.http").write_text(f"{head}content-length: {len(body)}\r\n\r\n{body}")
    port = servers.free_port()
    config, log = logs / f"shed-{name}.cfg", logs / f"shed-{name}-balancer.log"
    config.write_text(
        HAPROXY.format(
            port=port,
            gateway=gateway.url.removeprefix("http://"),
            capacity=args.capacity,
            max_body=settings.GATEWAY_MAX_BODY_BYTES,
            body_seconds=int(settings.GATEWAY_BODY_SECONDS),
            busy_file=logs / "shed-busy.http",
            busy_body=logs / "shed-busy.json",
        )
    )
    process = servers.start(["haproxy", "-db", "-f", str(config)], env, log)
    servers.wait_for_port(port, process, log)
    return servers.Running(process, log, f"http://127.0.0.1:{port}")


def checkout(revision: str, where: Path) -> Path:
    """`revision`'s tracked files in `where` (git archive: nothing in the repository changes)."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def start_doors(names: list[str], args: argparse.Namespace, logs: Path) -> dict[str, Door]:
    base = dict(os.environ) | {"GATEWAY_EXECUTOR": "inline", "GATEWAY_MAX_IN_FLIGHT": str(args.capacity)}
    doors: dict[str, Door] = {}
    for name in names:
        lag = name.endswith("lag")  # the door and GATEWAY_MAX_LOOP_LAG_MS
        env = base | {"GATEWAY_MAX_LOOP_LAG_MS": str(args.lag_ms if lag else 0)}
        server = servers.UVICORN + (["--limit-concurrency", str(args.uvicorn_limit)] if name == "uvicorn" else [])
        if name == "before":  # the app door on an earlier revision's code, to hold a change against it in one run
            server = servers.UVICORN + ["--app-dir", str(checkout(args.before, logs / "shed-before"))]
        gateway = servers.start_gateway_under(server, env, logs / f"shed-{name}.log")
        doors[name] = Door(name, gateway.url, [gateway])
        if name.startswith("haproxy"):
            balancer = start_haproxy(name, gateway, args, env, logs)
            doors[name] = Door(name, balancer.url, [gateway, balancer])
    return doors


def arrange(door: Door, placement: str) -> None:
    """The door's processes and this one where `placement` puts them (the flood places itself)."""
    everything = set(range(os.cpu_count() or 1))
    gateway, *rest = door.running
    pin({gateway.process.pid}, GATEWAY_CPU if placement == "apart" else everything)
    pin({r.process.pid for r in rest}, everything - GATEWAY_CPU if placement == "apart" else everything)
    place(placement, niced=False)


def phase(door: Door, placement: str, kind: str, key: str, args: argparse.Namespace) -> dict:
    arrange(door, placement)
    url = door.url
    if kind == "unloaded":
        unloaded, _, _ = measured_apart(url, key, args)
        return {"calls": len(unloaded), "p50_ms": statistics.median(unloaded) * 1000, "p99_ms": p99(unloaded) * 1000}
    out: multiprocessing.Queue = multiprocessing.Queue()
    # At capacity: the flood fills what the measured sessions and the probe leave of it.
    clients = max(1, args.capacity - args.sessions - 1) if kind == "capacity" else args.flood or args.capacity * 10
    flooder_key = args.flood_key if kind == "sessions" else key
    if kind == "sessions":
        sessions_count_reset(args.flood_agent)  # each sessions phase floods from none, whatever went before
    records = session_records()
    flood_args = (kind, url, flooder_key, clients, args.seconds + 1, args.hostile, placement, out)
    flooding = multiprocessing.Process(target=flood, args=flood_args, daemon=True)
    cpu = sessions_cpu_seconds(door.sessions())
    flooding.start()
    admitted, shed, probed = measured_apart(url, key, args, lambda: probe(url, key, args.seconds))
    answers, flood_cpu = out.get(timeout=args.seconds + 60)
    flooding.join(timeout=30)
    cpu = sessions_cpu_seconds(door.sessions()) - cpu
    after, _ = asyncio.run(measured(url, key, 1, 1.0, 0))  # still serving once the flood is over
    figures = {
        "probe": summary(probed),
        "admitted_calls": len(admitted),
        "admitted_p99_ms": p99(admitted) * 1000,
        "measured_shed": shed,
        "served_after": len(after) > 0,
        "door_cpu_s": cpu,
        "flood_cpu_s": flood_cpu,
    }
    left = {"sessions_left_in_redis": session_records() - records} if kind == "sessions" else {}
    return summary(answers) | left | figures


def run_all(doors: dict[str, Door], key: str, args: argparse.Namespace) -> dict:
    """Every design through each phase in turn (unloaded first, then one kind of flood at a time), `--rounds`
    times over: each round's ratios are against that round's own unloaded and at-capacity p99s."""
    designs = [(d, p) for d in doors for p in args.placements.split(",")]
    results: dict = {f"{d}/{p}": {} for d, p in designs}
    for _ in range(args.rounds):
        for kind in ("unloaded", *args.kinds.split(",")):
            for door, placement in designs:
                name = f"{door}/{placement}"
                result = phase(doors[door], placement, kind, key, args)
                if kind != "unloaded":
                    unloaded = results[name]["unloaded"][-1]["p99_ms"]
                    result["admitted_p99_over_unloaded"] = result["admitted_p99_ms"] / unloaded
                if kind not in ("unloaded", "capacity") and "capacity" in results[name]:
                    at_capacity = results[name]["capacity"][-1]["admitted_p99_ms"]
                    result["admitted_p99_over_capacity"] = result["admitted_p99_ms"] / at_capacity
                results[name].setdefault(kind, []).append(result)
                print(f"{name} {kind}: {json.dumps(result)}", file=sys.stderr, flush=True)
                args.out.write_text(json.dumps(results, indent=2))  # so far: a run cut short keeps what it measured
    arrange(next(iter(doors.values())), "shared")
    return results


def _ms(p50: float | None, p99_ms: float | None) -> str:
    return f"{p50:.1f} / {p99_ms:.1f}" if p99_ms is not None else ""


def _statuses(r: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items(), key=lambda kv: -kv[1]))


def table(results: dict) -> str:
    lines = [
        "| design | flood | round | its answers | its 429/503 p50 / p99 ms (with Retry-After) | its 4xx p50 / p99 ms "
        "| the probe's answers | the probe's 503 p50 / p99 ms | unloaded p99 ms | admitted p99 ms | / unloaded "
        "| / at capacity | measured shed | door CPU s | flood CPU s | served after |",
        "|---|---|---:|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for design, kinds in results.items():
        for kind in KINDS:
            for n, r in enumerate(kinds.get(kind, []), 1):
                p, unloaded = r["probe"], kinds["unloaded"][n - 1]
                refusal = _ms(r["refusal_p50_ms"], r["refusal_p99_ms"])
                refusal += f" ({r['refusals_with_retry_after']} of {r['refusals']})" if refusal else ""
                over_capacity = f"{r['admitted_p99_over_capacity']:.2f}" if "admitted_p99_over_capacity" in r else ""
                other = _ms(r["other_refusals_p50_ms"], r["other_refusals_p99_ms"])
                left = f" ({r['sessions_left_in_redis']} sessions left in Redis)" if kind == "sessions" else ""
                lines.append(
                    f"| {design} | {kind} | {n} | {_statuses(r)}{left} | {refusal} | {other} "
                    f"| {_statuses(p)} | {_ms(p['refusal_p50_ms'], p['refusal_p99_ms'])} | {unloaded['p99_ms']:.2f} "
                    f"| {r['admitted_p99_ms']:.2f} | {r['admitted_p99_over_unloaded']:.2f} | {over_capacity} "
                    f"| {r['measured_shed']} "
                    f"| {r['door_cpu_s']:.1f} | {r['flood_cpu_s']:.1f} | {'yes' if r['served_after'] else '**no**'} |"
                )
    return "\n".join(lines)


def bars(results: dict) -> str:
    """The bars round by round, with the median: admitted p99 over unloaded, and the probe's refusals' p99."""
    lines = [
        "| design | flood | admitted p99 / unloaded, each round | median | the probe's refusal p99 ms, each round |",
        "|---|---|---|---:|---|",
    ]
    for design, kinds in results.items():
        for kind in KINDS:
            rounds = kinds.get(kind, [])
            if not rounds:
                continue
            ratios = [r["admitted_p99_over_unloaded"] for r in rounds]  # nan: fewer than 2 measured calls admitted
            admitted = [x for x in ratios if x == x]
            refusals = ", ".join(
                "-" if r["probe"]["refusal_p99_ms"] is None else f"{r['probe']['refusal_p99_ms']:.0f}" for r in rounds
            )
            each = ", ".join(f"{x:.2f}" if x == x else "under 2 admitted" for x in ratios)
            median = f"{statistics.median(admitted):.2f}" if admitted else "-"
            lines.append(f"| {design} | {kind} | {each} | {median} | {refusals} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--capacity", type=int, default=16, help="GATEWAY_MAX_IN_FLIGHT; the flood is ten times it")
    parser.add_argument("--sessions", type=int, default=2, help="measured sessions")
    parser.add_argument("--seconds", type=float, default=10.0, help="each phase's length")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--doors", default=",".join(DOORS))
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--before", help="a revision: add the door `before`, the app door on that revision's code")
    parser.add_argument("--flood", type=int, help="the flood's clients (10 x capacity)")
    parser.add_argument("--lag-ms", type=float, default=5.0, help="GATEWAY_MAX_LOOP_LAG_MS of the *-lag doors")
    parser.add_argument("--uvicorn-limit", type=int, help="uvicorn's --limit-concurrency (4 x capacity)")
    parser.add_argument("--hostile", action="store_true", help="the flood retries at once instead of after Retry-After")
    parser.add_argument(
        "--rate", type=float, default=10.0, help="each measured session's calls a second; 0: back to back"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="every phase of every design this many times, interleaved"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/shed.json")
    args = parser.parse_args()
    args.uvicorn_limit = args.uvicorn_limit or 4 * args.capacity
    logs = args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    key = setup_database()
    from policy.models import Agent
    from policy.services import agent_create

    Agent.objects.filter(name="bench-flood").delete()
    flooder = agent_create(name="bench-flood")  # another agent: the measured sessions' own count stays clear
    args.flood_key, args.flood_agent = flooder.key, flooder.agent.pk
    doors = start_doors(args.doors.split(",") + (["before"] if args.before else []), args, logs)
    try:
        results = run_all(doors, key, args)
    finally:
        for door in doors.values():
            for running in reversed(door.running):
                running.stop()
    args.out.write_text(json.dumps(results, indent=2))
    print(table(results))
    print()
    print(bars(results))


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    main()
