"""Where a Celery call's time goes beyond an inline one, at one call at a time (issue 22's Celery bar).

All in this process on uvloop, with the gateway's own code, against a real worker and the demo upstream over
stdio, in rounds that alternate the worker's pool (`threads`, as deployed, and `solo`, which runs a task in the
thread that took it off the broker):

- inline:    the inline executor's `request` (the pool's thread and the stdio round trip);
- celery:    the Celery executor's `request` for the same call (published, run by the worker, replied);
- direct:    the same with GATEWAY_CALL_TRANSPORT=direct: pushed to the worker's call consumer, which takes it
             off Redis on its upstream pool's loop (registry/call_consumer.py), past Celery's consumer;
- refused:   the same task message with a broken MAC, which the worker refuses and answers at once: what the
             broker and the worker's dispatch cost with no call in them (both ways through Redis, the worker
             taking the message, checking its MAC, replying);
- direct refused: a pushed call with a broken MAC: the same floor for the call consumer;
- publish:   the publish alone (`task_publish`: the message built and pushed);
- envelope:  building and sealing the message alone (no I/O);

each with its p50 and the worker process's CPU per call (its own, not its upstream's).

    bench/run celery_floor [--rounds 3] [--calls 1000]
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import ARGUMENTS, process_cpu_seconds, setup_database  # noqa: E402  (bench/run.py: the same data and environment)

from tests import servers  # noqa: E402  (the process helpers the tests use)

POOLS = ("threads", "solo")


async def timed(action: Callable[[], Awaitable[object]], calls: int, worker: int) -> tuple[float, float]:
    """p50 ms, and the worker's CPU ms per call."""
    for _ in range(min(calls, 50)):
        await action()
    times, cpu = [], process_cpu_seconds(worker)
    for _ in range(calls):
        started = time.perf_counter()
        await action()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, (process_cpu_seconds(worker) - cpu) * 1000 / calls


def actions(upstream_id: int, revision: int) -> dict[str, Callable[[], Awaitable[object]]]:
    from celery import current_app
    from django.conf import settings
    from django.test import override_settings

    from gateway_project.lib import task_mac
    from gateway_project.lib.redis_clients import async_redis
    from registry.executor import CeleryExecutor, InlineExecutor, reply_key, reply_opened
    from registry.publish import call_envelope, calls_key, task_envelope, task_publish
    from registry.upstreams.requests import UpstreamRequest

    request = UpstreamRequest.tool_call(upstream_id, revision, "echo", ARGUMENTS, timeout=30)
    inline, celery = InlineExecutor(), CeleryExecutor()
    current_app.loader.import_default_modules()  # the tasks autodiscovery registers (the web process: at start)
    task = current_app.tasks["registry.request"]
    kwargs = {"request": asdict(request), "call": "bench"}

    async def ok(executor) -> None:
        outcome = await executor.request(request)
        assert outcome["ok"], outcome

    async def refused() -> None:
        key = reply_key()
        envelope = json.loads(task_envelope(task, kwargs=kwargs | {"reply_to": key}, queue="upstream", expires=30))
        envelope["headers"][task_mac.HEADER] = {"nonce": "x", "exp": 0, "mac": "x"}
        broker = async_redis(settings.CELERY_BROKER_URL)
        await broker.lpush("upstream", json.dumps(envelope))
        reply = await async_redis().blpop([key], timeout=10)
        outcome = reply_opened(task.name, key, reply[1])
        assert outcome.get("code") == "TASK_REFUSED", outcome

    async def direct() -> None:
        with override_settings(GATEWAY_CALL_TRANSPORT="direct"):
            await ok(celery)

    async def direct_refused() -> None:
        key = reply_key()
        envelope = json.loads(call_envelope(kwargs | {"reply_to": key}, expires=30))
        envelope["seal"] = {"nonce": "x", "exp": 0, "mac": "x"}
        await async_redis(settings.CELERY_BROKER_URL).lpush(calls_key(), json.dumps(envelope))
        reply = await async_redis().blpop([key], timeout=10)
        outcome = reply_opened(task.name, key, reply[1])
        assert outcome.get("code") == "TASK_REFUSED", outcome

    async def publish() -> None:
        await task_publish(task.name, kwargs=kwargs | {"reply_to": reply_key()}, queue="bench-nobody", expires=30)

    async def envelope() -> None:
        task_envelope(task, kwargs=kwargs | {"reply_to": reply_key()}, queue="upstream", expires=30)

    return {
        "inline": lambda: ok(inline),
        "celery": lambda: ok(celery),
        "direct": direct,
        "refused": refused,
        "direct refused": direct_refused,
        "publish": publish,
        "envelope": envelope,
    }


async def measure_round(found: dict, pool: str, calls: int, worker: int) -> None:
    from django.conf import settings

    from gateway_project.lib.redis_clients import async_redis
    from registry.models import Upstream

    upstream = await Upstream.objects.aget(slug="demo")
    for name, action in actions(upstream.id, upstream.revision).items():
        found.setdefault(f"{name} ({pool})", []).append(await timed(action, calls, worker))
    await async_redis(settings.CELERY_BROKER_URL).delete("bench-nobody")


async def run_rounds(args: argparse.Namespace, env: dict[str, str], logs: Path) -> dict[str, list]:
    """One event loop for every round (this process's Redis clients belong to it); workers started aside."""
    found: dict[str, list] = {}
    for turn in range(args.rounds):
        for pool in POOLS if turn % 2 == 0 else POOLS[::-1]:
            worker = await asyncio.to_thread(
                servers.start_worker, env | {"GATEWAY_EXECUTOR": "celery"}, logs / f"celery-floor-{pool}.log", pool
            )
            try:
                await measure_round(found, pool, args.calls, worker.process.pid)
            finally:
                await asyncio.to_thread(worker.stop)
            print(f"round {turn + 1} {pool}: {json.dumps({k: v[-1] for k, v in found.items() if pool in k})}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/celery_floor.json")
    args = parser.parse_args()
    setup_database()
    found = uvloop.run(run_rounds(args, dict(os.environ), args.out.parent))
    args.out.write_text(json.dumps(found, indent=2))
    print("| what | p50 ms | the worker's CPU ms/call |\n|---|---:|---:|")
    for name, runs in found.items():
        p50s, cpus = [r[0] for r in runs], [r[1] for r in runs]
        p50 = f"{statistics.median(p50s):.3f} [{min(p50s):.3f}–{max(p50s):.3f}]"
        print(f"| {name} | {p50} | {statistics.median(cpus):.2f} [{min(cpus):.2f}–{max(cpus):.2f}] |")


if __name__ == "__main__":
    main()
