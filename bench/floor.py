"""The floor under issue 22's bars: the least a call can cost through any gateway that keeps Switchboard's
promises on this machine, against mcp-proxy measured in the same run.

The promises' own round trips, made with the gateway's own code (audit/writer.py, policy/limits/stores.py) and
nothing else, one call's worth at a time: admission (one Lua script in Redis, which in the cheapest design
would also read the session's record and handoff state), the `approved` row committed before the upstream is
touched, then the `completed` row committed together with the admission's release before the reply. mcp-proxy's
p50 already holds the client, HTTP and the upstream's round trip, so a gateway that added nothing but its
promises would answer in about mcp-proxy's p50 plus theirs. Under load the machine's CPU is the bound: such a
gateway would spend at least mcp-proxy's machine CPU per call plus what the promises cost the machine (this
process, PostgreSQL, Redis), so its calls/s could reach at most mcp-proxy's times the ratio of the two.
The gateway (inline, uvicorn, PostgreSQL and Redis: `gateway-strict`, and `gateway-local` with
GATEWAY_AUDIT_COMMIT=local) is measured in the same rounds, and set against the floor of its mode: its p50 over
the floor's (mcp-proxy's p50 plus the promises'), its calls/s over the floor's (mcp-proxy's times the floor's
ratio). Its audit upkeep may checkpoint the rows written here: they are sealed as its own are.

The composed floor, in the same rounds (`composed-strict`, `composed-local`): mcp-proxy's calls with each mode's
promises made around every call by this process, in a call's order (`composed`): measured whole, so it holds what
the promises and the call cost each other on this machine, which the summed floor leaves out. It is no lower bound
(the promises are made a hop from mcp-proxy, by one more process than a gateway has), so the bars stay against the
summed floor, with the composed one beside it.

Issue 39's CPU bar, in the same rounds: each server's CPU a call read from /proc over the measured calls (its
process alone, every thread: mcp-proxy's or the gateway's, not the stdio upstream's), and the promises' CPU a call
in this process (the admission script's and the two rows' client side); the gateway's own CPU a call is its
process's less the promises', set against mcp-proxy's whole process's CPU a call.

The other modes, same rounds (`--modes`, all by default): the Celery executor under uvicorn, its worker taking calls
directly (`gateway-celery`), and the embedded default as scripts/demo serves it (`embedded`: Daphne, SQLite, inline),
each against mcp-proxy and against the strict gateway's p50 (issue 39's Celery and embedded bars).

Beside it, where each target's machine CPU a call went, by process (`parts_table`): the client, the server's
process, what it spawned (its stdio upstream), PostgreSQL, Redis and the rest, read from /proc around every block
(in clock ticks, so a figure is only as fine as a tick over a target's calls).

Within a round, each concurrency's calls are made in blocks, the targets' order turning from block to block, every
target's sessions open throughout; a target's blocks are pooled (its latencies, wall time and CPU).

    bench/run floor [--rounds 3] [--calls 1000] [--sessions 1,8,32] [--blocks 4] [--modes strict,local,celery,embedded]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import (  # noqa: E402
    DEMO,
    OTHER_SERVERS,
    PROXY,
    cpu_by_part,
    http_session,
    machine_cpu_seconds,
    opened,
    process_cpu_seconds,
    processes_cpu,
    setup_database,
    start_embedded,
    summary,
)

from tests import servers  # noqa: E402  (the process helpers the tests use)

# The gateway in each mode: the inline gateway under uvicorn, with the settings bench/run.py starts it with.
GATEWAYS = {"gateway-strict": "inline-uvicorn", "gateway-local": "inline-uvicorn-local"}
# The other modes, each against the strict gateway's p50 in the same rounds (issue 39's bars): the Celery executor
# (its worker taking calls directly, the default with a Redis broker) within 2 ms, the embedded default (Daphne,
# SQLite, as scripts/demo serves it) at most 1.3 times.
MODES = {"gateway-celery": "celery-direct-uvicorn", "embedded": "embedded"}
CHOSEN = {"strict": "gateway-strict", "local": "gateway-local", "celery": "gateway-celery", "embedded": "embedded"}
# The composed floor's targets and their modes (the module's docstring).
COMPOSED = {"composed-strict": "strict", "composed-local": "local"}


def promise_parts():
    """The gateway's writers (strict and `local`) and Redis admission store, and one call's claim and audit
    fields; on the running loop, whose connections the writers keep."""
    from django.conf import settings

    from audit.writer import AsyncAuditWriter
    from policy.limits.admission import Admission, AgentLimits, UpstreamLimits
    from policy.limits.stores import RedisLimitStore

    writers = {}
    for mode in ("strict", "local"):
        settings.GATEWAY_AUDIT_COMMIT = mode  # read as a writer sets up this loop's connections
        writers[mode] = AsyncAuditWriter()
        writers[mode].pool()
    unlimited = 10**9
    agent = AgentLimits(unlimited, unlimited)
    upstream = UpstreamLimits(1, "demo", None, "", unlimited, unlimited, 5, 30.0, 10.0)

    def call(session: int) -> tuple[Admission, dict]:
        request_id = uuid.uuid4()
        fields = {
            "request_id": request_id,
            "trace_id": uuid.uuid4().hex,
            "agent_id": 1,
            "agent_name": "bench",
            "session_id": f"floor-{session}",
            "transport": "http",
            "exposed_name": "demo__echo",
            "arguments_sha256": "0" * 64,
            "upstream": "demo",
            "tool": "echo",
        }
        return Admission(str(request_id), f"floor-{session}", 1, agent, upstream), fields

    return writers, RedisLimitStore(), call


def promised(parts, mode: str):
    """One call's promises in its order, `promise(admission, fields, upstream_call)`: admit, the approved row
    committed, the call, then the completed row committed with the admission's release."""
    writers, store, _ = parts
    writer = writers[mode]

    async def promise(admission, fields: dict, upstream_call):
        verdict = await store.admit(admission)
        assert not verdict.code, verdict
        await writer.record(kind="approved", detail={"deadline": time.time() + 60}, **fields)
        result = await upstream_call()
        completed = writer.record(kind="completed", duration_ms=0.5, response_bytes=64, outcome="ok", **fields)
        await asyncio.gather(completed, store.release(admission, "ok", verdict.probing))
        return result

    return promise


def composed(parts, mode: str):
    """`around` (bench/run.py `opened`) that makes a call's promises around it, its ids made as part of the call."""
    promise, call = promised(parts, mode), parts[2]

    async def around(session: int, upstream_call):
        return await promise(*call(session), upstream_call)

    return around


async def _nothing() -> None:
    return None


async def promises(parts, mode: str, sessions: int, calls: int) -> dict:
    """`calls` calls' promises from `sessions` concurrent tasks, with no call between them, as `opened`'s block
    answers them (this process's CPU as the server's: the promises' client side, every thread); each timed from
    its admission on, its ids made first, as at `db08961`."""
    promise, call = promised(parts, mode), parts[2]

    async def drive(session: int, count: int, latencies: list[float]) -> None:
        for _ in range(count):
            admission, fields = call(session)
            started = time.perf_counter()
            await promise(admission, fields, _nothing)
            latencies.append(time.perf_counter() - started)

    latencies: list[float] = []
    machine, own, started = machine_cpu_seconds(), time.process_time(), time.perf_counter()
    await asyncio.gather(*(drive(s, calls // sessions, latencies) for s in range(sessions)))
    wall, machine = time.perf_counter() - started, machine_cpu_seconds() - machine
    return {"latencies": latencies, "wall": wall, "server": time.process_time() - own, "machine": machine}


def floors(found: dict) -> dict:
    """Within one round at one concurrency: the floor's ratios to mcp-proxy, and the gateway's, against each floor
    of its mode: the summed one (mcp-proxy's and the promises' measured apart) and the composed one."""
    proxy = found["proxy"]
    out = {}
    for mode in ("strict", "local"):
        own = found[f"promises-{mode}"]
        p50 = (proxy["p50_ms"] + own["p50_ms"]) / proxy["p50_ms"]
        # One call at a time waits on latency; many at once, on the machine's CPU.
        rate = (
            1 / p50
            if proxy["sessions"] == 1
            else proxy["machine_cpu_ms"] / (proxy["machine_cpu_ms"] + own["machine_cpu_ms"])
        )
        out[f"floor-{mode}"] = {"p50_ratio": p50, "calls_ratio": rate}
        whole = found[f"composed-{mode}"]
        out[f"composed-{mode}"] = {
            "p50_ratio": whole["p50_ms"] / proxy["p50_ms"],
            "calls_ratio": whole["calls_per_s"] / proxy["calls_per_s"],
        }
        gateway = found.get(f"gateway-{mode}")
        if gateway:  # against the floors of its own mode
            own_cpu = gateway["server_cpu_ms"] - found[f"promises-{mode}"]["server_cpu_ms"]
            out[f"gateway-{mode}"] = {
                "p50_ratio": gateway["p50_ms"] / (proxy["p50_ms"] * p50),
                "calls_ratio": gateway["calls_per_s"] / (proxy["calls_per_s"] * rate),
                "own_cpu_ms": own_cpu,  # issue 39: at most mcp-proxy's server CPU a call
                "own_cpu_ratio": own_cpu / proxy["server_cpu_ms"],
                "p50_composed": gateway["p50_ms"] / whole["p50_ms"],
                "calls_composed": gateway["calls_per_s"] / whole["calls_per_s"],
            }
    strict = found.get("gateway-strict")
    for name in (n for n in MODES if n in found):
        mode = found[name]
        out[name] = {
            "p50_ratio": mode["p50_ms"] / proxy["p50_ms"],
            "calls_ratio": mode["calls_per_s"] / proxy["calls_per_s"],
        }
        if strict:
            out[name] |= {
                "p50_less_strict_ms": mode["p50_ms"] - strict["p50_ms"],
                "p50_over_strict": mode["p50_ms"] / strict["p50_ms"],
            }
    return out


def cell(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}–{max(values):.{digits}f}]"


def parts_table(rounds: list[dict], sessions: list[int]) -> str:
    """Where each target's machine CPU a call went, by process: the client (for the promises, their client side),
    the server's process, its upstream, PostgreSQL, Redis, and the rest of the machine."""
    parts = ("client", "server", "upstream", "postgres", "redis", "rest")
    lines = ["| sessions | what (CPU ms a call) | " + " | ".join(parts) + " |", "|---:|---|" + "---:|" * len(parts)]
    for s in sessions:
        for name in rounds[0][str(s)]["measured"]:
            taken = [r[str(s)]["measured"][name]["parts_ms"] for r in rounds]
            lines.append(f"| {s} | {name} | " + " | ".join(cell([t[p] for t in taken]) for p in parts) + " |")
    return "\n".join(lines)


RATIOS = ("p50_ratio", "calls_ratio", "own_cpu_ms", "own_cpu_ratio", "p50_composed", "calls_composed")


def table(rounds: list[dict], sessions: list[int]) -> str:
    lines = [
        "| sessions | what | p50 ms | calls/s | machine CPU ms/call | server CPU ms/call (promises: this process's) "
        "| p50 / proxy (gateway: / its floor) | calls/s / proxy (gateway: / its floor) "
        "| gateway's own CPU ms/call (less the promises') | own CPU / proxy's server CPU "
        "| gateway: p50 / composed floor | gateway: calls/s / composed floor |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sessions:
        at = [r[str(s)] for r in rounds]
        for name in ("proxy", "promises-strict", "promises-local", *COMPOSED, *GATEWAYS, *MODES):
            if name not in at[0]["measured"]:
                continue
            measured = [a["measured"][name] for a in at]
            ratios = [a["ratios"].get(name) for a in at]
            p50 = cell([m["p50_ms"] for m in measured])
            rate = cell([m["calls_per_s"] for m in measured], 0)
            cpu = cell([m["machine_cpu_ms"] for m in measured])
            server = cell([m["server_cpu_ms"] for m in measured])
            shown = (cell([r[k] for r in ratios]) if ratios[0] and k in ratios[0] else "" for k in RATIOS)
            lines.append("| " + " | ".join(map(str, (s, name, p50, rate, cpu, server, *shown))) + " |")
        for mode in ("strict", "local"):
            ratios = [a["ratios"][f"floor-{mode}"] for a in at]
            p50_ratio, calls_ratio = (cell([r[k] for r in ratios]) for k in ("p50_ratio", "calls_ratio"))
            lines.append(f"| {s} | **floor, {mode} audit** | | | | | {p50_ratio} | {calls_ratio} | | | | |")
    return "\n".join(lines)


def modes_table(rounds: list[dict], sessions: list[int]) -> str:
    """The other modes against the strict gateway's p50, same rounds: issue 39's Celery and embedded bars."""
    lines = [
        "| sessions | Celery (direct) p50 less strict's, ms (bar ≤ 2 at 1 session) "
        "| embedded p50 / strict's (bar ≤ 1.3 at 1 session) |",
        "|---:|---:|---:|",
    ]
    for s in sessions:
        ratios = [r[str(s)]["ratios"] for r in rounds]
        shown = (
            cell([r[name][k] for r in ratios]) if k in ratios[0].get(name, {}) else ""
            for name, k in (("gateway-celery", "p50_less_strict_ms"), ("embedded", "p50_over_strict"))
        )
        lines.append(f"| {s} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


async def one_round(
    parts, targets: dict, sessions: list[int], args: argparse.Namespace, turn: int, label: str = ""
) -> dict:
    """Each target's calls at each concurrency in `args.blocks` blocks, the targets' order turning from block to
    block (and from round to round), their sessions open throughout: a load that drifts meanwhile weighs on every
    target alike. A target's blocks are pooled into its figures."""
    found: dict = {}
    names = ["proxy", "promises-strict", "promises-local", *COMPOSED, *(n for n in (*GATEWAYS, *MODES) if n in targets)]
    names = names[turn % len(names) :] + names[: turn % len(names)]
    label = label or f"round {turn + 1}"
    for s in sessions:
        async with AsyncExitStack() as stack:
            blocks: dict = {}
            for name in names:
                if name.startswith("promises-"):
                    blocks[name] = partial(promises, parts, name.removeprefix("promises-"), s)
                    await blocks[name](args.warmup * s)  # its warm-up: one block unmeasured
                else:
                    open_session, tool, pid = targets[name]
                    server_cpu = partial(process_cpu_seconds, pid)
                    promising = {"around": composed(parts, COMPOSED[name])} if name in COMPOSED else {}
                    blocks[name] = await stack.enter_async_context(
                        opened(open_session, tool, s, args.warmup, server_cpu, **promising)
                    )
            taken: dict = {name: [] for name in names}
            spent: dict = {name: {} for name in names}  # each target's CPU seconds by part (`cpu_by_part`)
            for b in range(args.blocks):
                for name in names[b % len(names) :] + names[: b % len(names)]:
                    before = processes_cpu()
                    taken[name].append(await blocks[name](max(s, args.calls // args.blocks)))
                    pid = targets[name][2] if name in targets else None
                    for part, seconds in cpu_by_part(before, processes_cpu(), pid).items():
                        spent[name][part] = spent[name].get(part, 0.0) + seconds
        measured = {name: summary(s, taken[name]) for name in names}
        for name in names:
            calls = measured[name]["calls"]
            measured[name]["parts_ms"] = {part: 1000 * t / calls for part, t in spent[name].items()}
        for name in names:
            print(f"{label} {s:3} sessions {name:22} {json.dumps(measured[name])}", file=sys.stderr)
        found[str(s)] = {"measured": measured, "ratios": floors(measured)}
    return found


async def run_rounds(targets: dict, args: argparse.Namespace) -> list[dict]:
    parts = promise_parts()
    sessions = [int(s) for s in args.sessions.split(",")]
    # One unmeasured round at the first concurrency: a target's first calls (its first connections, prepared
    # statements, lazy imports) would otherwise fall in the first round's figure of whichever target comes first.
    await one_round(parts, targets, sessions[:1], args, 0, label="warm-up")
    rounds = [await one_round(parts, targets, sessions, args, turn) for turn in range(args.rounds)]
    for writer in parts[0].values():
        await writer.close()
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per target and concurrency")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured calls per session first")
    parser.add_argument("--blocks", type=int, default=4, help="blocks a target's calls are measured in, interleaved")
    parser.add_argument("--sessions", default="1,8,32")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/floor.json")
    parser.add_argument(
        "--modes", default="strict,local,celery,embedded", help="the gateway's modes measured beside the floor, or none"
    )
    args = parser.parse_args()
    chosen = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(chosen) - CHOSEN.keys()):
        parser.error(f"--modes: no mode {', '.join(unknown)}; the modes are {', '.join(CHOSEN)}")
    key = setup_database()  # the audit table, the agent and upstream the gateway's benches use
    env, logs = dict(os.environ), args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    port = servers.free_port()
    command = [str(PROXY), "--port", str(port), "--host", "127.0.0.1", "--log-level", "WARNING", "--", *DEMO]
    proxy = servers.Running(servers.start(command, env, logs / "floor-proxy.log"), logs / "floor-proxy.log")
    started = [proxy]
    try:
        servers.wait_for_port(port, proxy.process, proxy.log)
        # With the pid of each server's process, whose CPU alone (not its upstream's) is the server's.
        targets = {"proxy": (lambda: http_session(f"http://127.0.0.1:{port}/mcp", {}), "echo", proxy.process.pid)}
        targets |= dict.fromkeys(COMPOSED, targets["proxy"])  # mcp-proxy's, with the promises around each call
        modes = {CHOSEN[m] for m in chosen}
        if "gateway-celery" in modes:  # its worker, which the gateway's process CPU leaves out
            started.append(servers.start_worker(env | {"GATEWAY_EXECUTOR": "celery"}, logs / "floor-worker.log"))
        for name, target in {**GATEWAYS, **MODES}.items():
            if name not in modes:
                continue
            if name == "embedded":  # SQLite of its own, with an agent of its own
                gateway, its_key = start_embedded(logs)
            else:
                server, extra = OTHER_SERVERS[target]
                log = logs / f"floor-{name}.log"
                gateway, its_key = (
                    servers.start_gateway_under(server, env | {"GATEWAY_EXECUTOR": "inline"} | extra, log),
                    key,
                )
            started.append(gateway)
            auth = {"Authorization": f"Bearer {its_key}"}
            targets[name] = (
                lambda u=gateway.url, a=auth: http_session(f"{u}/mcp", a),
                "demo__echo",
                gateway.process.pid,
            )
        rounds = asyncio.run(run_rounds(targets, args))
    finally:
        for running in started:
            running.stop()
    args.out.write_text(json.dumps(rounds, indent=2))
    sessions = [int(s) for s in args.sessions.split(",")]
    print(table(rounds, sessions), modes_table(rounds, sessions), parts_table(rounds, sessions), sep="\n\n")


if __name__ == "__main__":
    main()
