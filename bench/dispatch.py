"""The gateway's own work per tools/call, without a transport: the dispatcher's `call_tool` (decision,
admission in Redis, two audit rows on PostgreSQL, release, the model's view of the result) against the bare
executor call it wraps, interleaved call by call in one process with the inline executor. The difference is
what the gateway adds; the transport (Daphne, the SDK's Streamable HTTP) is measured by bench/run.py.

    bench/run dispatch --calls 1000
"""

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import ARGUMENTS, setup_database  # noqa: E402  (bench/run.py: the same data and environment)


async def measure(key: str, calls: int) -> dict[str, list[float]]:
    from mcp import types

    from handoff.mcp.caller import Caller
    from handoff.mcp.tools import call_tool
    from handoff.snapshot import snapshot
    from registry.executor import get_executor
    from registry.upstreams.requests import UpstreamRequest

    snap = await snapshot.get()
    holder = snap.key_holder(key)
    caller = Caller(agent_id=holder.agent_id, agent_name=holder.agent_name, transport="bench", key_prefix=holder.prefix)
    # A 2025-11-25 request of a client that declared nothing and asked for no progress: no relay is carried.
    session = SimpleNamespace(client_capabilities=None)
    ctx = SimpleNamespace(
        request=caller, request_id=1, protocol_version="2025-11-25", session=session, params={}, meta=None
    )
    params = types.CallToolRequestParams(name="demo__echo", arguments=ARGUMENTS)
    route = snap.tools["demo__echo"].route

    async def executor_only() -> None:
        await get_executor().request(
            UpstreamRequest.tool_call(route.upstream_id, route.revision, "echo", ARGUMENTS, timeout=30)
        )

    async def dispatched() -> None:
        await call_tool(ctx, params)

    times: dict[str, list[float]] = {"executor": [], "dispatcher": []}
    for _ in range(20):  # warm: the upstream's session, the audit connections, the Redis client
        await executor_only()
        await dispatched()
    for _ in range(calls):
        for name, action in (("executor", executor_only), ("dispatcher", dispatched)):
            started = time.perf_counter()
            await action()
            times[name].append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    key = setup_database()
    times = asyncio.run(measure(key, args.calls))
    print("| what | p50 ms | p90 ms |")
    print("|---|---:|---:|")
    for name, values in times.items():
        deciles = statistics.quantiles(values, n=10)
        print(f"| {name} | {statistics.median(values):.3f} | {deciles[8]:.3f} |")
    added = [d - e for d, e in zip(times["dispatcher"], times["executor"], strict=True)]
    print(f"| the gateway's own work (dispatcher − executor, per pair) | {statistics.median(added):.3f} | |")


if __name__ == "__main__":
    main()
