"""Audit rows from async code on SQLite (the embedded default): one long-lived connection in one thread of the
process, as PostgreSQL's rows go through the loop's long-lived connections (audit/writer.py). SQLite takes one
writer at a time, so one thread writes for every event loop. Rows that arrive while a commit is in flight go out
together, as one multi-row INSERT, in the next commit; each caller returns only once its own row is committed."""

import asyncio
import logging
import queue
import sqlite3
import threading
from typing import Any

from audit.writer_errors import AuditCommits, AuditSettled, AuditUnavailable

logger = logging.getLogger(__name__)
BATCH = 64  # rows in one commit at most, as on PostgreSQL; 64 rows' values stay far below SQLite's 32,766

_Row = tuple[list[Any], asyncio.Future[None]]


class SqliteAuditWriter:
    """The thread starts with the first row and lives until closed, holding its connection open (where Django's
    connections, conn_max_age=0 under `database_sync_to_async`, would open one for every row). A database locked
    by another writer is waited on for `timeout` seconds (SQLite's busy handler), then the rows are refused."""

    def __init__(
        self, *, path: str, timeout: float, init: str, table: str, columns: list[str], counts: AuditCommits
    ) -> None:
        self._path, self._timeout, self._init, self._counts = path, timeout, init, counts
        self._head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
        self._marks = "(" + ", ".join(["?"] * len(columns)) + ")"
        self._queue: queue.SimpleQueue[_Row | None] | None = None  # the running thread's
        self._lock = threading.Lock()  # a row is never queued behind the sentinel of a thread that is ending

    async def insert(self, params: list[Any]) -> None:
        """Return once the row is committed; AuditSettled if a constraint refused it, else AuditUnavailable."""
        done = asyncio.get_running_loop().create_future()
        with self._lock:  # held for a put: never long
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(self._queue,), name="audit-sqlite", daemon=True).start()
            self._queue.put((params, done))
        await done  # a cancelled caller stops no commit: the row is written (or refused) all the same

    def close(self) -> None:
        """Let the thread write what it was given, then close its connection and end; a later row starts
        another."""
        with self._lock:
            rows, self._queue = self._queue, None
            if rows is not None:
                rows.put(None)

    def _run(self, rows: queue.SimpleQueue[_Row | None]) -> None:
        db: sqlite3.Connection | None = None
        while (batch := _batch(rows)) is not None:
            try:
                db = db or self._connect()
                self._write(db, batch)
            except sqlite3.Error as exc:  # no connection to be had, or the database refused the whole batch
                if db is not None:
                    db.close()
                    db = None
                _settle(batch, _error(exc))
            except Exception as exc:  # a bug must not leave the batch's callers waiting for ever
                logger.exception("audit batch of %d rows failed", len(batch))
                _settle(batch, AuditUnavailable(str(exc)))
        if db is not None:
            db.close()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self._path, timeout=self._timeout, isolation_level=None)
        try:
            db.executescript(self._init)  # the pragmas Django's own connections run (WAL, synchronous)
        except sqlite3.Error:
            db.close()
            raise
        return db

    def _write(self, db: sqlite3.Connection, batch: list[_Row]) -> None:
        """The batch in one statement, so one commit (autocommit); if a constraint refuses it, row by row, so
        that only the refused rows' callers fail."""
        try:
            db.execute(self._insert(len(batch)), [value for params, _ in batch for value in params])
        except sqlite3.IntegrityError as exc:
            if len(batch) == 1:
                return _settle(batch, _error(exc))
        else:
            return self._committed(batch)
        for row in batch:
            try:
                db.execute(self._insert(1), row[0])
            except sqlite3.IntegrityError as exc:
                _settle([row], _error(exc))
            else:
                self._committed([row])

    def _committed(self, batch: list[_Row]) -> None:
        self._counts.transactions += 1
        self._counts.rows += len(batch)
        _settle(batch, None)

    def _insert(self, count: int) -> str:
        return self._head + ", ".join([self._marks] * count)


def _batch(rows: queue.SimpleQueue[_Row | None]) -> list[_Row] | None:
    """The next rows: one waited for, then those already queued behind it; None once closed."""
    first = rows.get()
    if first is None:
        return None
    batch = [first]
    while len(batch) < BATCH:
        try:
            row = rows.get_nowait()
        except queue.Empty:
            break
        if row is None:  # closed: write these first
            rows.put(None)
            break
        batch.append(row)
    return batch


def _error(exc: sqlite3.Error) -> Exception:
    refused = AuditSettled(str(exc)) if isinstance(exc, sqlite3.IntegrityError) else AuditUnavailable(str(exc))
    refused.__cause__ = exc
    return refused


def _settle(batch: list[_Row], error: Exception | None) -> None:
    """Each row's caller woken on its own loop, from this thread."""
    for _, done in batch:
        try:
            done.get_loop().call_soon_threadsafe(_settle_one, done, error)
        except RuntimeError:  # its loop is closed: nobody waits for it any more
            pass


def _settle_one(done: asyncio.Future[None], error: Exception | None) -> None:
    if done.done():  # its caller was cancelled
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
