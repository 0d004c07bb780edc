"""The Celery bar through the whole gateway, call by call: one session on each of inline-uvicorn, celery-uvicorn
(calls as Celery tasks) and celery-direct-uvicorn (calls pushed to the worker's call consumer), all under
uvicorn and sharing one worker, called in turn one call at a time, the order turned every call. On a machine
whose load swings by the second, every target sees the same swings; `bench/run --targets ...` measures each
for a minute apart.

Per round: each target's p50, and each Celery target's p50 less inline's; then the medians over the rounds.

    bench/run celery_ab [--rounds 3] [--calls 1000]
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import ARGUMENTS, setup_database, start_targets  # noqa: E402  (bench/run.py: the same servers and data)

TARGETS = ("inline-uvicorn", "celery-uvicorn", "celery-direct-uvicorn")


async def one_round(targets: dict, calls: int, warmup: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in TARGETS}
    async with AsyncExitStack() as stack:
        clients = {name: (await stack.enter_async_context(targets[name][0]()), targets[name][1]) for name in TARGETS}
        for turn in range(warmup + calls):
            order = TARGETS[turn % 3 :] + TARGETS[: turn % 3]
            for name in order if turn % 2 else order[::-1]:
                client, tool = clients[name]
                started = time.perf_counter()
                result = await client.call_tool(tool, ARGUMENTS)
                if turn >= warmup:
                    times[name].append(time.perf_counter() - started)
                assert not result.is_error, result
    return {name: statistics.median(found) * 1000 for name, found in times.items()}


async def run_rounds(targets: dict, rounds: int, calls: int) -> list[dict[str, float]]:
    found = []
    for number in range(rounds):
        p50 = await one_round(targets, calls, warmup=50)
        found.append(p50)
        excess = {name: round(p50[name] - p50["inline-uvicorn"], 3) for name in TARGETS[1:]}
        print(f"round {number + 1}: p50 {json.dumps({k: round(v, 3) for k, v in p50.items()})} over inline {excess}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/celery_ab.json")
    args = parser.parse_args()
    key = setup_database()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    targets, started = start_targets(key, args.out.parent, TARGETS)
    try:
        found = asyncio.run(run_rounds(targets, args.rounds, args.calls))
    finally:
        for running in started:
            running.stop()
    args.out.write_text(json.dumps(found, indent=2))
    print("| target | p50 ms, rounds | p50 less inline-uvicorn's, ms: rounds (median) |\n|---|---|---|")
    for name in TARGETS:
        excess = [r[name] - r["inline-uvicorn"] for r in found]
        rounds = ", ".join(f"{e:.2f}" for e in excess)
        less = "" if name == TARGETS[0] else f"{rounds} ({statistics.median(excess):.2f})"
        print(f"| {name} | {', '.join(f'{r[name]:.2f}' for r in found)} | {less} |")


if __name__ == "__main__":
    main()
