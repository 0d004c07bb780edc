"""What a durable audit row costs through the async writer: N rows written by C concurrent tasks (each one
row after another, as calls write theirs), per writer variant, in interleaved rounds; medians of rows/s and
of the latency of one row (its await), the rows per commit, and the CPU time per row of this process and of
the PostgreSQL backends serving its audit connections (read from /proc: PostgreSQL on this machine; the WAL
writer's share, which synchronous_commit = off moves off the backends, is not in it).

    bench/run audit_commit                       # N=4000, C=1,8,32, 5 rounds
    bench/run audit_commit --rows 2000 --rounds 3 --before 166b7d0

Writers: `before`, audit/writer.py as it was at --before (by default the commit before group commit: each
row its own INSERT and commit, on up to GATEWAY_AUDIT_POOL_SIZE connections), `strict` (group commit, the
default) and `local` (the same with GATEWAY_AUDIT_COMMIT=local).
"""

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402
from django.test import override_settings  # noqa: E402

from audit.writer import AsyncAuditWriter  # noqa: E402

COLUMNS = (
    "rows/s",
    "p50 ms per row",
    "p90 ms per row",
    "rows per commit",
    "client CPU ms/row",
    "PostgreSQL CPU ms/row",
)


def writer_at(rev: str) -> Any:
    """audit/writer.py as it was at `rev`, loaded beside today's."""
    source = subprocess.check_output(["git", "show", f"{rev}:audit/writer.py"], cwd=ROOT, text=True)
    module = types.ModuleType(f"audit_writer_{rev}")
    exec(compile(source, f"{rev}:audit/writer.py", "exec"), module.__dict__)
    return module.AsyncAuditWriter()


def backend_pids() -> list[int]:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [f"switchboard-audit-{os.getpid()}"]
        )
        pids = [pid for (pid,) in cursor.fetchall()]
    connections["default"].close()
    return pids


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User and system CPU of these processes (fields 14 and 15 of /proc/<pid>/stat, in clock ticks)."""
    seconds = {}
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        seconds[pid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return seconds


def make(variant: str, before: str) -> Any:
    return writer_at(before) if variant == "before" else AsyncAuditWriter()


async def one_run(writer: Any, rows: int, tasks: int) -> tuple[float, ...]:
    """rows/s, p50 and p90 ms per row, rows per commit (0 where the writer does not count), and CPU ms per row of
    this process and of the PostgreSQL backends."""
    latencies: list[float] = []

    async def write(count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            await writer.record(
                kind="completed", request_id=uuid.uuid4(), agent_name="bench", upstream="files", tool="read_file",
                outcome="ok", duration_ms=1.5, response_bytes=120, detail={"bench": True},
            )  # fmt: skip
            latencies.append(time.perf_counter() - started)

    # Warm: as many connections open, outside the timing, as the run will use (the pool's size at most).
    await asyncio.gather(*(write(1) for _ in range(max(tasks, settings.GATEWAY_AUDIT_POOL_SIZE))))
    server = cpu_seconds(await asyncio.to_thread(backend_pids))
    counts = getattr(writer, "commits", None)
    before = (counts.transactions, counts.rows) if counts else (0, 0)
    latencies.clear()
    client, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(write(rows // tasks) for _ in range(tasks)))
    elapsed = time.perf_counter() - started
    client = time.process_time() - client
    after = cpu_seconds(await asyncio.to_thread(backend_pids))
    server_seconds = sum(seconds - server.get(pid, 0.0) for pid, seconds in after.items())
    await writer.close()
    grouping = (counts.rows - before[1]) / (counts.transactions - before[0]) if counts else 0.0
    written = len(latencies)
    return (
        written / elapsed,
        statistics.median(latencies) * 1000,
        statistics.quantiles(latencies, n=10)[-1] * 1000,
        grouping,
        client * 1000 / written,
        server_seconds * 1000 / written,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--tasks", default="1,8,32")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", default="166b7d0", help="the commit whose audit/writer.py is `before`")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    variants = ["before", "strict", "local"]
    results: dict[tuple[int, str], list[tuple[float, ...]]] = {}
    for round_ in range(args.rounds):
        for tasks in [int(t) for t in args.tasks.split(",")]:
            order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]  # rotate who goes first
            for variant in order:
                with override_settings(GATEWAY_AUDIT_COMMIT="local" if variant == "local" else "strict"):
                    result = asyncio.run(one_run(make(variant, args.before), args.rows, tasks))
                results.setdefault((tasks, variant), []).append(result)
    print(f"{args.rows} rows per run, {args.rounds} rounds, medians [min–max]\n")
    print(f"| C | writer | {' | '.join(COLUMNS)} |\n|---:|---|{'---:|' * len(COLUMNS)}")
    for (tasks, variant), runs in sorted(results.items(), key=lambda item: (item[0][0], variants.index(item[0][1]))):
        cells = []
        for column, digits in enumerate((0, 2, 2, 1, 3, 3)):
            values = [run[column] for run in runs]
            if not any(values):  # a writer that does not count its commits
                cells.append("–")
                continue
            low, mid, high = (f"{v:.{digits}f}" for v in (min(values), statistics.median(values), max(values)))
            cells.append(f"{mid} [{low}–{high}]")
        print(f"| {tasks} | {variant} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
