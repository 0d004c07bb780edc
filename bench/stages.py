"""What each stage of a tools/call costs (handoff/mcp/pipeline/), in one process with the inline executor, the
strict path's stores (PostgreSQL for the audit, Redis for admission) and the demo upstream:

- per stage, its CPU (this thread's) and its wall time a call, median over the calls; the frame's and the
  answer's wall time come from the pipeline's own timers (switchboard_call_stage_seconds);
- the extra-stage points (handoff/stages.py) with nothing registered, as configured (the built-in result filter
  on by default), and with one no-op stage at each point: the time a call, median of REPEATS runs of ROUNDS
  calls each, less an empty loop's time in the same run.

    bench/run stages --calls 1000
"""

import argparse
import asyncio
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import ARGUMENTS, setup_database  # noqa: E402  (bench/run.py: the same data and environment)

REPEATS, ROUNDS = 7, 20_000
ORDER = ["frame", "caller", "route", "decide", "sign_off", "admit", "before_execute", "approval_row", "execute"]
ORDER += ["result", "completion_row", "answer"]


async def stage_costs(key: str, calls: int) -> dict[str, dict[str, list[float]]]:
    """Each stage's CPU and wall time (µs) of every call, by stage."""
    from mcp import types

    from handoff.mcp.caller import Caller
    from handoff.mcp.pipeline import run
    from handoff.mcp.tools import call_tool
    from handoff.snapshot import snapshot

    snap = await snapshot.get()
    holder = snap.key_holder(key)
    caller = Caller(agent_id=holder.agent_id, agent_name=holder.agent_name, transport="bench", key_prefix=holder.prefix)
    session = SimpleNamespace(client_capabilities=None)  # a 2025-11-25 client that declared nothing
    ctx = SimpleNamespace(request=caller, request_id=1, protocol_version="2025-11-25", session=session, params={})
    ctx.meta = None
    params = types.CallToolRequestParams(name="demo__echo", arguments=ARGUMENTS)
    costs: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"cpu": [], "wall": []})
    measuring = False
    stage_run, observe = run.stage_run, run.stages_observe

    async def timed(call: Any, name: str, stage: Callable[[Any], Awaitable[None]]) -> None:
        cpu = time.thread_time()
        await stage_run(call, name, stage)
        if measuring:
            costs[name]["cpu"].append((time.thread_time() - cpu) * 1e6)

    def observed(timers: dict[str, float]) -> None:
        observe(timers)
        if measuring:
            for name, seconds in timers.items():
                costs[name]["wall"].append(seconds * 1e6)

    run.stage_run, run.stages_observe = timed, observed
    try:
        for _ in range(20):  # warm: the upstream's session, the audit connections, the Redis client
            await call_tool(ctx, params)
        measuring = True
        for _ in range(calls):
            await call_tool(ctx, params)
    finally:
        run.stage_run, run.stages_observe = stage_run, observe
    return costs


async def points_cost(key: str) -> dict[str, float]:
    """The extra-stage points' time a call (µs), by what is registered, less an empty loop's."""
    from handoff import stages as registry
    from handoff.mcp.caller import Caller
    from handoff.mcp.pipeline import extra
    from handoff.mcp.pipeline.call import Call
    from handoff.mcp.pipeline.run import stage_run

    caller = Caller(agent_id=1, agent_name="bench", transport="bench", key_prefix="")
    call = Call("demo__echo", dict(ARGUMENTS), "0" * 32, caller=caller, upstream="demo")
    result = {"content": [{"type": "text", "text": "benchmark"}], "isError": False}
    noop = (registry.Stage("noop", registry.BEFORE, lambda view: None),)
    noop_after = (registry.Stage("noop", registry.AFTER, lambda view, result: result),)
    chains: dict[str, Callable[[str], tuple[Any, ...]]] = {
        "nothing registered": lambda point: (),
        "as configured": registry.stages,
        "one no-op stage at each point": lambda point: noop if point == registry.BEFORE else noop_after,
    }

    async def points() -> None:
        call.result = result
        await stage_run(call, "before_execute", extra.before_execute_stage)
        await extra.after_execute_stages(call)

    async def nothing() -> None:
        pass

    def per_call(action: Callable[[], Awaitable[None]]) -> Awaitable[float]:
        async def timed() -> float:
            started = time.perf_counter_ns()
            for _ in range(ROUNDS):
                await action()
            return (time.perf_counter_ns() - started) / ROUNDS / 1000

        return timed()

    runs: dict[str, list[float]] = defaultdict(list)
    stages = extra.stages
    try:
        for _ in range(REPEATS):  # interleaved: each chain beside the empty loop in every repeat
            floor = await per_call(nothing)
            for name, chain in chains.items():
                extra.stages = chain
                runs[name].append(await per_call(points) - floor)
    finally:
        extra.stages = stages
    return {name: statistics.median(values) for name, values in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    key = setup_database()
    costs = asyncio.run(stage_costs(key, args.calls))
    print(f"Stages of a direct call (demo__echo, inline executor, PostgreSQL and Redis), {args.calls} calls:\n")
    print("| stage | CPU µs a call (p50) | wall µs a call (p50) |")
    print("|---|---:|---:|")
    for name, cost in sorted(costs.items(), key=lambda item: ORDER.index(item[0])):
        cpu = f"{statistics.median(cost['cpu']):.0f}" if cost["cpu"] else "–"
        print(f"| {name} | {cpu} | {statistics.median(cost['wall']):.0f} |")
    cpu_total = sum(statistics.median(cost["cpu"]) for cost in costs.values() if cost["cpu"])
    print(f"| sum of the stages' CPU medians | {cpu_total:.0f} | |")
    print(f"\nExtra-stage points, µs a call (median of {REPEATS} runs of {ROUNDS:,} calls, less an empty loop):\n")
    print("| registered | µs a call |")
    print("|---|---:|")
    for name, microseconds in asyncio.run(points_cost(key)).items():
        print(f"| {name} | {microseconds:.2f} |")


if __name__ == "__main__":
    main()
