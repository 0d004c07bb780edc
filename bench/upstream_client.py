"""What the SDK's client costs a call to a stdio upstream (issue 22, item 3: "measure first"): `echo` to
examples/demo_upstream.py through the SDK's `Client` (what the pool holds) against a bare JSON-lines exchange
on the same pipe (write one request, read one line), one call at a time on uvloop, rounds alternating.
CPU is this process's alone: the client side, which is what a gateway would save.

    .venv/bin/python bench/upstream_client.py [--rounds 3] [--calls 2000]
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop
from mcp import Client, StdioServerParameters

DEMO = [sys.executable, str(Path(__file__).parents[1] / "examples/demo_upstream.py")]
ECHO = {"name": "echo", "arguments": {"text": "benchmark"}}
HELLO = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}


async def timed(call: Callable[[], Awaitable[object]], calls: int) -> tuple[float, float]:
    """p50 ms and this process's CPU ms per call, after a warm-up."""
    for _ in range(min(calls, 200)):
        await call()
    times, cpu = [], time.process_time()
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, (time.process_time() - cpu) * 1000 / calls


async def bare(calls: int, command: list[str] = DEMO) -> tuple[float, float]:
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=2**24
    )
    ids = iter(range(1, 10**9))

    async def request(method: str, params: dict) -> dict:
        process.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}).encode()
        )
        process.stdin.write(b"\n")
        await process.stdin.drain()
        return json.loads(await process.stdout.readline())

    try:
        await request("initialize", HELLO)
        process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

        async def call() -> None:
            assert not (await request("tools/call", ECHO))["result"].get("isError")

        return await timed(call, calls)
    finally:
        process.kill()
        await process.wait()


async def sdk(calls: int) -> tuple[float, float]:
    async with Client(StdioServerParameters(command=DEMO[0], args=DEMO[1:]), mode="legacy") as client:

        async def call() -> None:
            assert not (await client.call_tool(ECHO["name"], ECHO["arguments"])).is_error

        return await timed(call, calls)


def table(found: dict[str, list[tuple[float, float]]]) -> None:
    """Each client's p50 and CPU a call: medians of the rounds [min–max], as a Markdown table."""
    print("| client | p50 ms | client CPU ms/call |\n|---|---:|---:|")
    for name, runs in found.items():
        p50s, cpus = [r[0] for r in runs], [r[1] for r in runs]
        print(
            f"| {name} | {statistics.median(p50s):.3f} [{min(p50s):.3f}–{max(p50s):.3f}] "
            f"| {statistics.median(cpus):.3f} [{min(cpus):.3f}–{max(cpus):.3f}] |"
        )


async def main(args: argparse.Namespace) -> None:
    found: dict[str, list[tuple[float, float]]] = {"SDK client": [], "bare JSON lines": []}
    for _ in range(args.rounds):
        found["SDK client"].append(await sdk(args.calls))
        found["bare JSON lines"].append(await bare(args.calls))
    table(found)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    uvloop.run(main(parser.parse_args()))
