"""What the inline executor's hop to a pool thread costs alone: a coroutine awaited on this loop against one
submitted to a second thread's loop (run_coroutine_threadsafe + wrap_future), bare and around an `echo` call over
stdio to examples/demo_upstream.py through the SDK client. Rounds alternate; medians of each round's p50.

    .venv/bin/python bench/pool_hop.py [--rounds 3] [--bare 20000] [--stdio 1500]
"""

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop
from mcp import Client, StdioServerParameters

DEMO = StdioServerParameters(
    command=sys.executable, args=[str(Path(__file__).parents[1] / "examples/demo_upstream.py")]
)
Call = Callable[[], Awaitable[Any]]


async def _yield_once() -> None:
    await asyncio.sleep(0)


def _hopped(make: Call, loop: asyncio.AbstractEventLoop) -> Call:
    return lambda: asyncio.wrap_future(asyncio.run_coroutine_threadsafe(make(), loop))  # type: ignore[arg-type]


async def _p50_ms(call: Call, count: int) -> float:
    for _ in range(min(count, 200)):
        await call()
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def _held(opened: "asyncio.Future[Client]", done: asyncio.Event) -> None:
    """A session opened and closed by one task on the pool thread's loop, as the pool's owner tasks do."""
    async with Client(DEMO, mode="legacy") as client:
        opened.get_loop().call_soon_threadsafe(opened.set_result, client)
        await done.wait()


async def main(args: argparse.Namespace) -> None:
    other = uvloop.new_event_loop()
    threading.Thread(target=other.run_forever, daemon=True).start()
    found: dict[str, list[float]] = {"bare, same loop": [], "bare, hop": [], "stdio, same loop": [], "stdio, hop": []}
    opened: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
    done = asyncio.Event()
    holder = asyncio.run_coroutine_threadsafe(_held(opened, done), other)
    async with Client(DEMO, mode="legacy") as here:
        there = await opened
        echo_here: Call = lambda: here.call_tool("echo", {"text": "benchmark"})  # noqa: E731
        echo_there: Call = lambda: there.call_tool("echo", {"text": "benchmark"})  # noqa: E731
        for _ in range(args.rounds):
            found["bare, same loop"].append(await _p50_ms(_yield_once, args.bare))
            found["bare, hop"].append(await _p50_ms(_hopped(_yield_once, other), args.bare))
            found["stdio, same loop"].append(await _p50_ms(echo_here, args.stdio))
            found["stdio, hop"].append(await _p50_ms(_hopped(echo_there, other), args.stdio))
    other.call_soon_threadsafe(done.set)
    await asyncio.wrap_future(holder)
    for name, values in found.items():
        print(f"{name:17} p50 {statistics.median(values):.3f} ms  rounds {[round(v, 3) for v in values]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bare", type=int, default=20000)
    parser.add_argument("--stdio", type=int, default=1500)
    uvloop.run(main(parser.parse_args()))
