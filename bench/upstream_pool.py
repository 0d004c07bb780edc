"""What the gateway's own upstream call path costs a call (issue 39, item 2): `echo` to examples/demo_upstream.py
through the pool (`UpstreamPool.request`, what both executors run for a tools/call: the shared connection, its
Delivery, timeout and error mapping, the result as the Outcome's JSON) against bench/upstream_client.py's bare
JSON-lines exchange and the SDK's `Client`, one call at a time on uvloop, rounds interleaved (each other round in
the other order). Both servers run as the pool starts them (GATEWAY_STDIO_SANDBOX's confinement). CPU is this
process's alone: the client side.

    .venv/bin/python bench/upstream_pool.py [--rounds 3] [--calls 2000]
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

import django  # noqa: E402

django.setup()

import anyio  # noqa: E402
import uvloop  # noqa: E402

from bench.upstream_client import DEMO, ECHO, bare, sdk, table, timed  # noqa: E402
from registry.upstreams.launch import launch, server_start  # noqa: E402
from registry.upstreams.pool import UpstreamPool  # noqa: E402
from registry.upstreams.requests import UpstreamRequest  # noqa: E402
from registry.upstreams.spec import UpstreamSpec  # noqa: E402

SPEC = UpstreamSpec(id=1, revision=1, slug="bench", transport="stdio", timeout=30, command=DEMO[0], args=DEMO[1:])


async def pool(calls: int) -> tuple[float, float]:
    async def load_spec(upstream_id: int, person: dict | None = None, catalog: bool = False) -> UpstreamSpec:
        return SPEC

    upstream_pool = UpstreamPool(load_spec)
    request = UpstreamRequest.tool_call(SPEC.id, SPEC.revision, ECHO["name"], ECHO["arguments"])

    async def call() -> None:
        outcome = await upstream_pool.request(request)
        assert outcome["ok"] and not outcome["result"].get("isError"), outcome

    async with anyio.create_task_group() as tg:
        await tg.start(upstream_pool.serve)
        try:
            return await timed(call, calls)
        finally:
            tg.cancel_scope.cancel()


async def main(args: argparse.Namespace) -> None:
    launched = launch(server_start(SPEC.slug, SPEC.command, SPEC.args, SPEC.env, SPEC.cwd, SPEC.sandbox))
    runs = {
        "gateway pool": pool,
        "SDK client": sdk,
        "bare JSON lines": lambda calls: bare(calls, launched.command),
    }
    found: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    try:
        for round_ in range(args.rounds):
            for name, run in runs.items() if round_ % 2 == 0 else reversed(runs.items()):
                found[name].append(await run(args.calls))
    finally:
        launched.release()
    table(found)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    uvloop.run(main(parser.parse_args()))
