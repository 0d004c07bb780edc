"""What a call to a REST upstream costs through the gateway, against a direct HTTP request to the same service.

examples/rest_service.py (127.0.0.1, its thread-per-connection stdlib server) is the service; its getItem
(`GET /items/{item_id}`, a small JSON object) is measured three ways, alternating call by call (the order turns
every call) in one process, one session each:

- direct: httpx2 `GET /items/5` on one kept-alive connection: the service alone;
- rest:   `inventory__getItem` through the gateway: inline executor under uvicorn (tests/servers.py UVICORN),
          audit on PostgreSQL, Redis, API-key auth, the official SDK client at 2025-11-25;
- mcp:    `demo__echo` through the same gateway to the demo MCP server over stdio: an MCP upstream on the
          same path, for scale.

    bench/run rest --calls 500 --rounds 3        # figures: bench/results/rest.json, the gateway's log beside it
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import http_session, setup_database  # noqa: E402  (bench/run.py: the same data and environment)

from tests import servers  # noqa: E402  (the process helpers the tests use)

WARMUP = 30
UNLIMITED = 10**9


def setup(service_url: str) -> str:
    """The demo upstream, the agent (bench/run.py) and the REST service as `inventory`; returns the agent's key."""
    key = setup_database()
    from registry.models import Upstream
    from registry.services import upstream_catalog_sync, upstream_save

    Upstream.objects.filter(slug="inventory").delete()
    inventory = Upstream(
        slug="inventory",
        transport="rest",
        openapi_url=f"{service_url}/openapi.json",
        internal=True,  # the example listens on 127.0.0.1
        calls_per_minute=UNLIMITED,
        rest_select={"include": ["getItem"]},
    )
    upstream_save(upstream=inventory, created=True)
    report = upstream_catalog_sync(upstream=inventory)
    assert report.ok, report.summary()
    return key


Times = dict[str, list[list[float]]]  # target -> one list of ms per round


async def measure(gateway_url: str, service_url: str, key: str, calls: int, rounds: int) -> Times:
    """Each target's calls, in ms, round by round."""
    auth = {"Authorization": f"Bearer {key}"}
    times: Times = {"direct": [], "rest": [], "mcp": []}
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        http_session(f"{gateway_url}/mcp", auth) as rest,
        http_session(f"{gateway_url}/mcp", auth) as mcp,
    ):

        async def direct() -> None:
            answer = await http.get(f"{service_url}/items/5")
            assert answer.json() == {"id": "5", "name": "item 5"}

        async def through_rest() -> None:
            result = await rest.call_tool("inventory__getItem", {"item_id": "5"})
            assert result.structured_content == {"id": "5", "name": "item 5"}, result

        async def through_mcp() -> None:
            result = await mcp.call_tool("demo__echo", {"text": "benchmark"})
            assert not result.is_error, result

        targets = {"direct": direct, "rest": through_rest, "mcp": through_mcp}
        for _ in range(WARMUP):
            for call in targets.values():
                await call()
        for round_ in range(rounds):
            taken: dict[str, list[float]] = {name: [] for name in targets}
            for n in range(calls):
                for name in list(targets) if n % 2 == 0 else list(reversed(targets)):
                    started = time.perf_counter()
                    await targets[name]()
                    taken[name].append((time.perf_counter() - started) * 1000)
            for name, values in taken.items():
                times[name].append(values)
            p50 = {name: statistics.median(values) for name, values in taken.items()}
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in p50.items()), file=sys.stderr)
    return times


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18]


def table(times: Times) -> str:
    lines = [
        "| target | p50 ms, each round | p50 ms | p95 ms | p50 − direct, ms | p50 / direct |",
        "|---|---|---:|---:|---:|---:|",
    ]
    direct = statistics.median(statistics.median(r) for r in times["direct"])
    for name, rounds in times.items():
        each = ", ".join(f"{statistics.median(r):.3f}" for r in rounds)
        p50 = statistics.median(statistics.median(r) for r in rounds)
        tail = statistics.median(p95(r) for r in rounds)
        # Within each round, as the calls alternated: the ratio of that round's medians.
        ratio = statistics.median(
            statistics.median(r) / statistics.median(d) for r, d in zip(rounds, times["direct"], strict=True)
        )
        lines.append(f"| {name} | {each} | {p50:.3f} | {tail:.3f} | {p50 - direct:.3f} | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500, help="measured calls per target and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/rest.json")
    args = parser.parse_args()
    logs = args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    service = servers.start_rest_service(logs / "rest-service.log", "", logs / "rest-service-note.txt")
    started = [service]
    try:
        key = setup(service.url)
        env = dict(os.environ) | {"GATEWAY_EXECUTOR": "inline"}
        gateway = servers.start_gateway_under(servers.UVICORN, env, logs / "rest-gateway.log")
        started.append(gateway)
        times = asyncio.run(measure(gateway.url, service.url, key, args.calls, args.rounds))
    finally:
        for running in started:
            running.stop()
    args.out.write_text(json.dumps(times))
    print(table(times))


if __name__ == "__main__":
    main()
