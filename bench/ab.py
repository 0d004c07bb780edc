"""Two builds of the gateway in one run: what a change is worth when whole runs on this machine move by tens of
percent. Each tree's inline gateway runs under uvicorn on the same PostgreSQL, Redis, keys (this checkout's var/) and
demo upstream; every session of both stays open throughout, and their calls go in alternating blocks, the order
turning from block to block. Printed: each build's p50, calls/s and process CPU a call (its process alone, every
thread, not its upstream's), pooled over its blocks, and the new build's as ratios of the base's.

    git worktree add /tmp/base <revision>
    bench/run ab --base /tmp/base [--new .] [--sessions 1] [--blocks 30] [--calls 200]
"""

import argparse
import asyncio
import os
import sys
from contextlib import AsyncExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import http_session, opened, process_cpu_seconds, setup_database, summary  # noqa: E402

from tests import servers  # noqa: E402  (the process helpers the tests use)

BUILDS = ("base", "new")


async def measure(gateways: dict[str, servers.Running], key: str, args: argparse.Namespace) -> dict[str, dict]:
    auth = {"Authorization": f"Bearer {key}"}
    async with AsyncExitStack() as stack:
        blocks = {}
        for name, running in gateways.items():
            pid = running.process.pid
            blocks[name] = await stack.enter_async_context(
                opened(
                    lambda url=running.url: http_session(f"{url}/mcp", auth),
                    "demo__echo",
                    args.sessions,
                    args.warmup,
                    lambda pid=pid: process_cpu_seconds(pid),
                )
            )
        measured: dict[str, list[dict]] = {name: [] for name in gateways}
        for index in range(args.blocks):
            for name in BUILDS if index % 2 == 0 else reversed(BUILDS):
                measured[name].append(await blocks[name](args.calls))
        return {name: summary(args.sessions, taken) for name, taken in measured.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", type=Path, required=True, help="the checkout of the build to compare against")
    parser.add_argument("--new", type=Path, default=ROOT, help="the checkout of the build measured (this one)")
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=30, help="blocks per build, alternating")
    parser.add_argument("--calls", type=int, default=200, help="calls per block")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured calls per session first")
    args = parser.parse_args()
    key = setup_database()
    env = dict(os.environ) | {"GATEWAY_EXECUTOR": "inline", "SWITCHBOARD_VAR_DIR": str(ROOT / "var")}
    logs = ROOT / "bench/results"
    logs.mkdir(parents=True, exist_ok=True)
    gateways: dict[str, servers.Running] = {}
    try:
        for name, tree in zip(BUILDS, (args.base, args.new), strict=True):
            log = logs / f"ab-{name}.log"
            gateways[name] = servers.start_gateway_under(servers.UVICORN, env, log, cwd=tree.resolve())
        results = asyncio.run(measure(gateways, key, args))
    finally:
        for running in gateways.values():
            running.stop()
    for name, result in results.items():
        print(
            f"{name:4} {args.sessions} sessions: p50 {result['p50_ms']:.3f} ms, {result['calls_per_s']:.0f} calls/s, "
            f"process CPU {result['server_cpu_ms']:.3f} ms a call"
        )
    base, new = results["base"], results["new"]
    ratios = {field: new[field] / base[field] for field in ("p50_ms", "calls_per_s", "server_cpu_ms")}
    print("new / base: p50 {p50_ms:.3f}, calls/s {calls_per_s:.3f}, process CPU {server_cpu_ms:.3f}".format(**ratios))


if __name__ == "__main__":
    main()
