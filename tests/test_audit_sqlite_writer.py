"""The embedded default's audit writer (audit/sqlite_writer.py) on a real SQLite file holding the audit table:
rows committed through one long-lived connection, a database another process locks waited on and then refused,
a row a constraint refuses failing alone."""

import asyncio
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.utils import ConnectionHandler

from audit.models import AuditEvent
from audit.writer import AsyncAuditWriter, AuditSettled, AuditUnavailable
from tests.helpers import run

# Another process takes SQLite's write lock and holds it until told to let go (a line on its stdin).
HOLD = (
    "import sqlite3, sys\n"
    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "db.execute('BEGIN IMMEDIATE')\n"
    "print('held', flush=True)\n"
    "sys.stdin.readline()\n"
    "db.execute('ROLLBACK')\n"
)


def sqlite_database(path: Path, timeout: float) -> BaseDatabaseWrapper:
    """A SQLite database with the audit table, configured as settings.py configures the embedded one."""
    init = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    options = {"init_command": init, "transaction_mode": "IMMEDIATE", "timeout": timeout}
    handler = ConnectionHandler({"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}})
    database = handler["default"]
    database.settings_dict["OPTIONS"] = options
    with database.schema_editor() as editor:
        editor.create_model(AuditEvent)
    database.close()
    return database


def rows(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as db:
        return db.execute("SELECT request_id, kind, detail, created_at FROM audit_auditevent ORDER BY id").fetchall()


@contextmanager
def locked(path: Path) -> Iterator[subprocess.Popen]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.communicate("\n", timeout=5)


@pytest.fixture
def database(db, tmp_path) -> BaseDatabaseWrapper:
    return sqlite_database(tmp_path / "embedded.sqlite3", timeout=0.2)


def test_concurrent_rows_are_committed_together_and_stored_as_django_stores_them(database):
    writer, request_ids = AsyncAuditWriter(database), [uuid.uuid4() for _ in range(100)]

    async def write() -> list[object]:
        try:
            return await asyncio.gather(
                *(writer.record(kind="completed", request_id=r, detail={"n": 1e20}) for r in request_ids)
            )
        finally:
            await writer.close()

    assert run(write) == [None] * 100
    stored = rows(Path(database.settings_dict["NAME"]))
    assert sorted(r[0] for r in stored) == sorted(r.hex for r in request_ids)  # Django's char(32) UUIDs
    assert {(r[1], r[2]) for r in stored} == {("completed", json.dumps({"n": 1e20}))}
    assert writer.commits.rows == 100 and writer.commits.transactions < 100  # rows queued meanwhile went together


def test_a_settled_row_fails_alone_and_the_rest_of_its_batch_commits(database):
    writer, settled, others = AsyncAuditWriter(database), uuid.uuid4(), [uuid.uuid4() for _ in range(5)]

    async def write() -> list[object]:
        try:
            await writer.record(kind="completed", request_id=settled, outcome="unknown")
            return await asyncio.gather(
                *(writer.record(kind="completed", request_id=r) for r in [*others[:2], settled, *others[2:]]),
                return_exceptions=True,
            )
        finally:
            await writer.close()

    outcome = run(write)
    assert outcome[:2] + outcome[3:] == [None] * 5
    assert isinstance(outcome[2], AuditSettled)
    assert str(outcome[2]) == "UNIQUE constraint failed: audit_auditevent.request_id"
    assert sorted(r[0] for r in rows(Path(database.settings_dict["NAME"]))) == sorted(r.hex for r in [settled, *others])


def test_a_database_locked_by_another_process_refuses_the_row_after_its_timeout_and_the_next_one_is_written(
    database,
):
    writer, refused, after = AsyncAuditWriter(database), uuid.uuid4(), uuid.uuid4()
    path = Path(database.settings_dict["NAME"])

    async def write(request_id: uuid.UUID) -> object:
        try:
            return await writer.record(kind="approved", request_id=request_id)
        except AuditUnavailable as exc:
            return exc

    with locked(path):
        failed = run(lambda: write(refused))
    written = run(lambda: write(after))
    run(writer.close)
    assert isinstance(failed, AuditUnavailable) and str(failed) == "database is locked"
    assert written is None
    assert [r[0] for r in rows(path)] == [after.hex]  # the refused row was never written


def release(holder: subprocess.Popen) -> None:
    holder.stdin.write("\n")
    holder.stdin.flush()


def test_a_row_waits_for_a_lock_released_within_its_timeout(db, tmp_path):
    database = sqlite_database(tmp_path / "embedded.sqlite3", timeout=10)
    writer, request_id = AsyncAuditWriter(database), uuid.uuid4()
    path = Path(database.settings_dict["NAME"])

    async def write(holder: subprocess.Popen) -> None:
        try:
            waiting = asyncio.ensure_future(writer.record(kind="approved", request_id=request_id))
            # Callbacks run in order: the task's first step (queueing the row) before the lock goes.
            asyncio.get_running_loop().call_soon(release, holder)
            await waiting
        finally:
            await writer.close()

    with locked(path) as holder:
        assert run(lambda: write(holder)) is None
    assert [r[0] for r in rows(path)] == [request_id.hex]
