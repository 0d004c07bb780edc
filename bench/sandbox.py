"""What the stdio sandbox costs (issue 34's bars): a bare JSON-lines round trip to examples/demo_upstream.py
(bench/upstream_client.py's `bare`) confined by bubblewrap (its cgroup and rlimits included, as the gateway
launches it) against unconfined, and a server's start through the gateway's stdio transport (spawn to the answer
to `initialize`; with `outbound`, its network made before the server runs), rounds interleaved (each other round
in the other order); medians of the rounds with their range.

    .venv/bin/python bench/sandbox.py [--rounds 3] [--calls 2000] [--starts 20]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

import django  # noqa: E402

django.setup()

import anyio  # noqa: E402
import uvloop  # noqa: E402
from mcp import types  # noqa: E402
from mcp.shared.message import SessionMessage  # noqa: E402

from bench.upstream_client import DEMO, HELLO, bare  # noqa: E402
from registry.upstreams.launch import ServerStart, launch  # noqa: E402
from registry.upstreams.sandbox import SandboxSettings  # noqa: E402
from registry.upstreams.stdio import stdio_transport  # noqa: E402

SANDBOXES = {
    "unconfined": None,
    "confined (network none)": SandboxSettings(),
    "confined (network outbound)": SandboxSettings(network="outbound"),
}
TRIPS = ("unconfined", "confined (network none)")  # outbound changes nothing on the pipes


def _start(sandbox: SandboxSettings | None) -> ServerStart:
    return ServerStart("bench", DEMO[0], tuple(DEMO[1:]), (), None, sandbox)


async def start(sandbox: SandboxSettings | None) -> float:
    """Milliseconds from the transport's start to the server's answer to `initialize`."""
    hello = types.JSONRPCRequest(jsonrpc="2.0", id=1, method="initialize", params=HELLO)
    began = time.perf_counter()
    with open(os.devnull, "wb") as errlog:
        async with stdio_transport(_start(sandbox), errlog, lambda ending: None) as (read, write):
            await write.send(SessionMessage(hello))
            await read.receive()
            return (time.perf_counter() - began) * 1000


async def main(args: argparse.Namespace) -> None:
    confined = launch(_start(SANDBOXES["confined (network none)"]))
    commands = {"unconfined": DEMO, "confined (network none)": confined.command}
    trips: dict[str, list[float]] = {name: [] for name in TRIPS}
    starts: dict[str, list[float]] = {name: [] for name in SANDBOXES}
    try:
        for round_ in range(args.rounds):
            for name in TRIPS if round_ % 2 == 0 else TRIPS[::-1]:  # neither always runs first
                trips[name].append((await bare(args.calls, commands[name]))[0])
            order = list(SANDBOXES.items())
            for name, sandbox in order if round_ % 2 == 0 else order[::-1]:
                starts[name].append(statistics.median([await start(sandbox) for _ in range(args.starts)]))
    finally:
        confined.release()
    print("| server | round trip p50 ms | ratio | start p50 ms | start added ms |\n|---|---:|---:|---:|---:|")
    base_trip, base_start = statistics.median(trips["unconfined"]), statistics.median(starts["unconfined"])
    for name in SANDBOXES:
        began = statistics.median(starts[name])
        cells = "– | –"
        if name in trips:
            trip = statistics.median(trips[name])
            cells = f"{trip:.3f} [{min(trips[name]):.3f}–{max(trips[name]):.3f}] | {trip / base_trip:.3f}"
        print(
            f"| {name} | {cells} | {began:.1f} [{min(starts[name]):.1f}–{max(starts[name]):.1f}] "
            f"| {began - base_start:+.1f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--starts", type=int, default=20)
    anyio.run(main, parser.parse_args(), backend_options={"loop_factory": uvloop.new_event_loop})
