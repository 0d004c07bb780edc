"""What the SDK's client costs a call to a stdio upstream (issue 22, item 3: "measure first"): `echo` to
examples/demo_upstream.py through the SDK's `Client` (what the pool holds) against a bare JSON-lines exchange
on the same pipe (write one request, read one line), one call at a time on uvloop, rounds alternating.
Client CPU is this process's alone: the client side, which is what a gateway would save. Upstream CPU is the
upstream's, and the bare exchange runs twice: in 2025-11-25 (after `initialize`) and in 2026-07-28 (each
request carrying the era's `_meta`, as the pool's direct line stamps it), for what the era costs the upstream.

    .venv/bin/python bench/upstream_client.py [--rounds 3] [--calls 2000]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import uvloop
from mcp import Client, StdioServerParameters

sys.path.insert(0, str(Path(__file__).parent))
from run import processes_cpu, spawned_by  # noqa: E402

DEMO = [sys.executable, str(Path(__file__).parents[1] / "examples/demo_upstream.py")]
ECHO = {"name": "echo", "arguments": {"text": "benchmark"}}
HELLO = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
MODERN = "2026-07-28"
# What a 2026-07-28 request carries in its params (the SDK's stamp, as the pool's direct line sends it).
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0.1.0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
Measured = tuple[float, float, float]  # p50 ms, client CPU ms a call, upstream CPU ms a call


def upstream_cpu() -> float:
    """CPU seconds of what this process spawned (the upstream, and any sandbox around it)."""
    found = processes_cpu()
    return sum(found[pid][2] for pid in spawned_by(found, os.getpid()))


async def timed(call: Callable[[], Awaitable[object]], calls: int) -> Measured:
    """p50 ms and this process's and the upstream's CPU ms per call, after a warm-up."""
    for _ in range(min(calls, 200)):
        await call()
    times, cpu, upstream = [], time.process_time(), upstream_cpu()
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    client, upstream = time.process_time() - cpu, upstream_cpu() - upstream
    return statistics.median(times) * 1000, client * 1000 / calls, upstream * 1000 / calls


async def bare(calls: int, command: list[str] = DEMO, era: str = "2025-11-25") -> Measured:
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=2**24
    )
    ids = iter(range(1, 10**9))

    async def request(method: str, params: dict) -> dict:
        params = params | {"_meta": MODERN_META} if era == MODERN else params
        process.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": next(ids), "method": method, "params": params}).encode()
        )
        process.stdin.write(b"\n")
        await process.stdin.drain()
        return json.loads(await process.stdout.readline())

    try:
        if era != MODERN:  # that era has no handshake
            await request("initialize", HELLO)
            process.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

        async def call() -> None:
            assert not (await request("tools/call", ECHO))["result"].get("isError")

        return await timed(call, calls)
    finally:
        process.kill()
        await process.wait()


async def sdk(calls: int) -> Measured:
    async with Client(StdioServerParameters(command=DEMO[0], args=DEMO[1:]), mode="legacy") as client:

        async def call() -> None:
            assert not (await client.call_tool(ECHO["name"], ECHO["arguments"])).is_error

        return await timed(call, calls)


def table(found: dict[str, list[Measured]]) -> None:
    """Each client's p50 and CPU a call: medians of the rounds [min–max], as a Markdown table."""
    print("| client | p50 ms | client CPU ms/call | upstream CPU ms/call |\n|---|---:|---:|---:|")
    for name, runs in found.items():
        cells = []
        for figures in zip(*runs, strict=True):
            cells.append(f"{statistics.median(figures):.3f} [{min(figures):.3f}–{max(figures):.3f}]")
        print(f"| {name} | " + " | ".join(cells) + " |")


async def main(args: argparse.Namespace) -> None:
    found: dict[str, list[Measured]] = {"SDK client": [], "bare JSON lines": [], f"bare JSON lines, {MODERN}": []}
    for _ in range(args.rounds):
        found["SDK client"].append(await sdk(args.calls))
        found["bare JSON lines"].append(await bare(args.calls))
        found[f"bare JSON lines, {MODERN}"].append(await bare(args.calls, era=MODERN))
    table(found)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    uvloop.run(main(parser.parse_args()))
