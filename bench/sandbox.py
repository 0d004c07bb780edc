"""What the stdio sandbox costs (issue 34's bars): a bare JSON-lines round trip to examples/demo_upstream.py
(bench/upstream_client.py's `bare`) confined by bubblewrap against unconfined, and a server's start (spawn to
the answer to `initialize`), rounds interleaved (each other round in the other order); medians of the rounds
with their range.

    .venv/bin/python bench/sandbox.py [--rounds 3] [--calls 2000] [--starts 20]
"""

import argparse
import asyncio
import json
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

import uvloop  # noqa: E402

from bench.upstream_client import DEMO, HELLO, bare  # noqa: E402
from registry.upstreams.sandbox import SandboxSettings, bwrap_command  # noqa: E402

CONFINED = bwrap_command(DEMO[0], DEMO[1:], None, SandboxSettings())
COMMANDS = {"unconfined": DEMO, "confined (network none)": CONFINED}


async def start(command: list[str]) -> float:
    """Milliseconds from spawn to the server's answer to `initialize`."""
    began = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=2**24
    )
    try:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": HELLO}
        process.stdin.write(json.dumps(hello).encode() + b"\n")
        await process.stdout.readline()
        return (time.perf_counter() - began) * 1000
    finally:
        process.kill()
        await process.wait()


async def main(args: argparse.Namespace) -> None:
    trips: dict[str, list[float]] = {name: [] for name in COMMANDS}
    starts: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for round_ in range(args.rounds):
        order = list(COMMANDS.items())
        for name, command in order if round_ % 2 == 0 else order[::-1]:  # neither always runs first
            trips[name].append((await bare(args.calls, command))[0])
            starts[name].append(statistics.median([await start(command) for _ in range(args.starts)]))
    print("| server | round trip p50 ms | ratio | start p50 ms | start added ms |\n|---|---:|---:|---:|---:|")
    base_trip, base_start = statistics.median(trips["unconfined"]), statistics.median(starts["unconfined"])
    for name in COMMANDS:
        trip, began = statistics.median(trips[name]), statistics.median(starts[name])
        print(
            f"| {name} | {trip:.3f} [{min(trips[name]):.3f}–{max(trips[name]):.3f}] | {trip / base_trip:.3f} "
            f"| {began:.1f} [{min(starts[name]):.1f}–{max(starts[name]):.1f}] | {began - base_start:+.1f} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--starts", type=int, default=20)
    uvloop.run(main(parser.parse_args()))
