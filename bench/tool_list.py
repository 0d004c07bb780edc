"""tools/list over 5,000 upstream tools (issue 22's bar: the gateway's first page p50 <= 50 ms; a full walk
reported against mcp-proxy fronting the same upstream; issue 38's: a virtual server's first page, offering a
pattern's share of the catalog, <= 1.2x /mcp's in the same run).

The demo upstream (examples/demo_upstream.py over stdio) serves --tools extra tools from a DEMO_MANIFEST file,
behind the gateway (inline, under uvicorn, on PostgreSQL and Redis: bench/run's environment) and behind
mcp-proxy. One SDK client session each (2025-11-25), the client's cache bypassed. The gateway pages its lists
(GATEWAY_LIST_PAGE_SIZE, 100 by default) and each agent's list is filtered by policy; mcp-proxy passes the
upstream's one page through. Each round measures --lists first pages and --lists full walks on both, the
order turned from round to round; the figures are medians over rounds of each round's p50.

    bench/run tool_list [--tools 5000] [--rounds 5] [--lists 20]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import DEMO, PROXY, http_session, setup_database  # noqa: E402  (bench/run.py: the same environment)

from tests import servers  # noqa: E402  (the process helpers the tests use)

SLUG = "big"
UNLIMITED = 10**9
# A virtual server offering 1,200 of the 5,000 tools, by patterns (each matched against every tool).
CURATED = {"name": "bench-curated", "tools": [f"{SLUG}__tool_00*", f"{SLUG}__tool_01?5?", f"{SLUG}__tool_02*9"]}


def manifest(count: int) -> Path:
    tools = [
        {
            "name": f"tool_{n:05d}",
            "description": f"Tool number {n}: looks up record {n} in the inventory and returns it.",
            "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
        }
        for n in range(count)
    ]
    path = Path(tempfile.mkdtemp()) / "manifest.json"
    path.write_text(json.dumps({"tools": tools}))
    return path


def setup(path: Path) -> str:
    """The bench agent's key, with the big upstream registered and its catalog synced."""
    key = setup_database()
    from registry.models import Upstream, VirtualServer
    from registry.services import upstream_catalog_sync, upstream_save
    from tests.factories import demo_sandbox

    Upstream.objects.filter(slug=SLUG).delete()
    VirtualServer.objects.update_or_create(name=CURATED["name"], defaults={"tools": CURATED["tools"]})
    env = {"DEMO_MANIFEST": str(path)}
    big = Upstream(slug=SLUG, transport="stdio", command=DEMO[0], args=DEMO[1:], env=env, calls_per_minute=UNLIMITED)
    big.sandbox = demo_sandbox(env)  # its manifest is a file the sandbox must show it
    upstream_save(upstream=big, created=True)
    started = time.perf_counter()
    report = upstream_catalog_sync(upstream=big)
    assert report.ok, report.summary()
    print(f"catalog of {SLUG} synced in {time.perf_counter() - started:.1f} s: {report.summary()}", file=sys.stderr)
    return key


async def timings(url: str, headers: dict[str, str], lists: int) -> tuple[list[float], list[float], int]:
    """First-page and full-walk times in ms, and how many tools a walk saw."""
    first, walks, seen = [], [], 0
    async with http_session(url, headers) as client:
        for _ in range(3):  # warm up: connections, the gateway's snapshot, the upstream's process
            await client.list_tools(cache_mode="bypass")
        for _ in range(lists):
            started = time.perf_counter()
            await client.list_tools(cache_mode="bypass")
            first.append((time.perf_counter() - started) * 1000)
        for _ in range(lists):
            started, cursor, seen = time.perf_counter(), None, 0
            while True:
                page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                seen += len(page.tools)
                if not (cursor := page.next_cursor):
                    break
            walks.append((time.perf_counter() - started) * 1000)
    return first, walks, seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lists", type=int, default=20)
    args = parser.parse_args()
    path = manifest(args.tools)
    key = setup(path)
    logs = Path(tempfile.mkdtemp())
    env = dict(os.environ) | {"DEMO_MANIFEST": str(path)}
    gateway = servers.start_gateway_under(servers.UVICORN, env | {"GATEWAY_EXECUTOR": "inline"}, logs / "gateway.log")
    port = servers.free_port()
    proxy_log = logs / "proxy.log"
    command = [str(PROXY), "--port", str(port), "--host", "127.0.0.1", "--log-level", "WARNING"]
    command += ["--env", "DEMO_MANIFEST", str(path), "--", *DEMO]  # mcp-proxy passes no environment of its own
    proxy = servers.start(command, env, proxy_log)
    servers.wait_for_port(port, proxy, proxy_log)
    targets = {
        "gateway": (f"{gateway.url}/mcp", {"Authorization": f"Bearer {key}"}),
        "virtual server": (f"{gateway.url}/mcp/s/{CURATED['name']}", {"Authorization": f"Bearer {key}"}),
        "proxy": (f"http://127.0.0.1:{port}/mcp", {}),
    }
    rounds: dict[str, list[tuple[float, float, int]]] = {name: [] for name in targets}
    try:
        for number in range(args.rounds):
            order = list(targets) if number % 2 == 0 else list(reversed(targets))  # interleaved, turned each round
            for name in order:
                first, walks, seen = asyncio.run(timings(*targets[name], args.lists))
                rounds[name].append((statistics.median(first), statistics.median(walks), seen))
                print(
                    f"round {number + 1} {name}: first page {rounds[name][-1][0]:.1f} ms, walk "
                    f"{rounds[name][-1][1]:.1f} ms ({seen} tools)",
                    file=sys.stderr,
                )
    finally:
        gateway.stop()
        servers.Running(proxy, proxy_log).stop()
    first_ratios = [v[0] / g[0] for v, g in zip(rounds["virtual server"], rounds["gateway"], strict=True)]
    print(
        f"virtual server's first page / /mcp's: {statistics.median(first_ratios):.2f} "
        f"[{min(first_ratios):.2f}–{max(first_ratios):.2f}] (bar: <= 1.2)"
    )
    print("| target | tools seen in a walk | first page p50 ms | full walk p50 ms | walk / proxy's |")
    print("|---|---:|---:|---:|---:|")
    walk_ratios = [g[1] / p[1] for g, p in zip(rounds["gateway"], rounds["proxy"], strict=True)]
    for name, measured in rounds.items():
        firsts, walks = [m[0] for m in measured], [m[1] for m in measured]
        ratio = statistics.median(walk_ratios) if name == "gateway" else 1.0
        spread = f" [{min(walk_ratios):.2f}–{max(walk_ratios):.2f}]" if name == "gateway" else ""
        ratio_shown = "" if name == "virtual server" else f"{ratio:.2f}{spread}"
        print(
            f"| {name} | {measured[-1][2]} | {statistics.median(firsts):.1f} [{min(firsts):.1f}–{max(firsts):.1f}] "
            f"| {statistics.median(walks):.1f} [{min(walks):.1f}–{max(walks):.1f}] | {ratio_shown} |"
        )


if __name__ == "__main__":
    main()
