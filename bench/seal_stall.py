"""What the embedded audit keeper's seal does to the serving loop (docs/reliability.md, "Load shedding"): a web
process without Celery seals the trail once a minute in a thread of its own (audit/tasks.py), and that thread's
Python work (the rows' dicts, their canonical form, their hashes) holds the GIL that the event loop's thread
needs back after every socket wait.

One process, pinned to one core as the gateway is in bench/shed.py's `apart` placement: an asyncio echo server and
client on loopback make round trips back to back while the seal of `--rows` audit rows runs (in a transaction
rolled back, so that every round seals the same rows), one variant at a time, interleaved over `--rounds`:

- before:   the seal as it was, its rows read 5,000 at a time;
- none:     no seal (the round trips alone, for as long as the previous seal took);
- chunked:  its rows read SEAL_CHUNK (audit/integrity.py) at a time.

Reported: the round trips' p50, p99 and longest, and the seal's own length.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/switchboard_bench LOG_LEVEL=WARNING \\
        .venv/bin/python bench/seal_stall.py --rows 20000 --rounds 5
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")

VARIANTS = {"before": 5000, "none": None, "chunked": 0}  # rows read at a time (0: SEAL_CHUNK)


class Rollback(Exception):
    pass


def rows_make(count: int) -> None:
    """`count` rows as a busy minute leaves them: approvals and completions of calls, old enough to seal."""
    import uuid

    from django.db import connection
    from django.utils import timezone

    from audit.models import AuditEvent

    with connection.cursor() as cursor:  # the bench's own database: start from an empty trail
        cursor.execute("TRUNCATE audit_auditevent, audit_auditcheckpoint")
    written = timezone.now() - timedelta(minutes=5)
    events = [
        AuditEvent(
            created_at=written,
            kind="approved" if n % 2 else "completed",
            request_id=uuid.uuid4(),
            agent_id=1,
            agent_name="bench",
            session_id=uuid.uuid4().hex,
            transport="http",
            upstream="demo",
            tool="echo",
            exposed_name="demo__echo",
            arguments_sha256="0" * 64,
            outcome="" if n % 2 else "ok",
            duration_ms=1.5,
            detail={"arguments": {"text": "x" * 40}},
            mac="k1:" + "0" * 64,
        )
        for n in range(count)
    ]
    AuditEvent.objects.bulk_create(events, batch_size=5000)


def seal() -> float:
    """One checkpoint over every row, rolled back; its length in seconds."""
    from django.db import close_old_connections, transaction

    from audit import integrity

    started = time.monotonic()
    try:
        with transaction.atomic():
            assert integrity.checkpoint_create() is not None
            raise Rollback
    except Rollback:
        pass
    finally:
        close_old_connections()
    return time.monotonic() - started


async def round_trips(stop: threading.Event | asyncio.Event, seconds: float | None) -> list[float]:
    """Loopback echo round trips of 64 bytes, back to back, until `stop` (or for `seconds`)."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(64):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    times: list[float] = []
    until = time.monotonic() + seconds if seconds else None
    while not stop.is_set() and (until is None or time.monotonic() < until):
        started = time.monotonic()
        writer.write(b"x" * 64)
        await reader.readexactly(64)
        times.append(time.monotonic() - started)
    writer.close()
    await writer.wait_closed()
    server.close()
    await server.wait_closed()
    return times


async def variant(name: str, last_seal: float) -> dict:
    if VARIANTS[name] is None:
        times = await round_trips(threading.Event(), last_seal)
        return {"seal_s": None, "times": times}
    from audit import integrity

    kept = integrity.SEAL_CHUNK
    integrity.SEAL_CHUNK = VARIANTS[name] or kept
    done = threading.Event()

    def sealing() -> float:
        try:
            return seal()
        finally:
            done.set()

    try:
        sealed = asyncio.get_running_loop().run_in_executor(None, sealing)
        times = await round_trips(done, None)
        return {"seal_s": await sealed, "times": times}
    finally:
        integrity.SEAL_CHUNK = kept


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20_000, help="rows sealed each time (a busy minute's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=0, help="the core the process is pinned to")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/seal_stall.json")
    args = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    rows_make(args.rows)
    os.sched_setaffinity(0, {args.cpu})
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    last_seal = 1.0
    for _ in range(args.rounds):
        for name in VARIANTS:  # `none` lasts as long as the seal before it
            outcome = asyncio.run(variant(name, last_seal))
            last_seal = outcome["seal_s"] or last_seal
            times = outcome["times"]
            results[name].append(
                {
                    "seal_s": outcome["seal_s"],
                    "round_trips": len(times),
                    "p50_ms": statistics.median(times) * 1000,
                    "p99_ms": sorted(times)[int(len(times) * 0.99)] * 1000,
                    "max_ms": max(times) * 1000,
                }
            )
            print(name, json.dumps(results[name][-1]), file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print("| variant | round | seal s | round trips | p50 ms | p99 ms | longest ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rounds in results.items():
        for n, r in enumerate(rounds, 1):
            seal_s = f"{r['seal_s']:.2f}" if r["seal_s"] else ""
            print(
                f"| {name} | {n} | {seal_s} | {r['round_trips']} | {r['p50_ms']:.3f} | {r['p99_ms']:.2f} "
                f"| {r['max_ms']:.1f} |"
            )


if __name__ == "__main__":
    main()
