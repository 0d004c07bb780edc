"""Audit rows on PostgreSQL (audit/writer.py's): each row goes straight from the event loop through a few
long-lived autocommit connections, from a column plan made once: no thread hop, no model instance, no query
compilation and no pool checkout on the path of every tool call. Rows that arrive while a commit is in flight go
out together, as one multi-row INSERT, in the next commit (group commit); each caller still returns only once its
own row is committed. A module of its own so that the embedded default, on SQLite, never imports psycopg (0.05 s of
its start)."""

import asyncio
import logging
import os
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import connections
from psycopg.types.json import Jsonb

from audit.writer_errors import AuditCommits, AuditSettled, AuditUnavailable

logger = logging.getLogger(__name__)

BATCH = 64  # rows in one commit at most: a bounded statement, and a bounded wait for a row behind the batch


@dataclass
class _Row:
    params: list[Any]
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def settle(self, error: Exception | None = None) -> None:
        if self.done.done():  # its caller was cancelled; the row was written (or refused) all the same
            return
        if error is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(error)


class AuditConnections:
    """At most `size` autocommit connections of one event loop. A row that finds no commit in flight starts
    one at once (no timer: a lone row waits for nothing); rows that come meanwhile queue and go out together
    in the next, at most BATCH to a commit; another connection is used only when more rows wait than the
    commits in flight will take next. When a connection breaks, the idle ones are dropped too (a database
    restart breaks them all): the rows of that commit fail, and the next commit opens a fresh connection."""

    def __init__(
        self, size: int, *, table: str, columns: list[str], json: list[bool], counts: AuditCommits, local: bool
    ) -> None:
        self._json = json  # per column: whether it is JSON (sent as jsonb)
        self._idle: list[psycopg.AsyncConnection] = []
        self._pending: deque[_Row] = deque()
        self._flushers: set[asyncio.Task[None]] = set()
        self._size, self._local, self._counts = size, local, counts
        self._head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
        self._width = len(columns)
        self._sql: dict[int, str] = {}

    async def insert(self, values: list[Any]) -> None:
        """Return once the row is committed; AuditSettled if a constraint refused it, else AuditUnavailable."""
        row = _Row([Jsonb(value) if is_json else value for value, is_json in zip(values, self._json, strict=True)])
        self._pending.append(row)
        if len(self._flushers) < self._size and len(self._pending) > BATCH * len(self._flushers):
            self._flushers.add(asyncio.create_task(self._flush()))  # a cancelled caller stops no commit
        await row.done

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """One of the loop's connections, given back after use; dropped, with the idle ones, if it broke."""
        conn = await self._take()
        try:
            yield conn
        except BaseException:  # cancelled mid-statement: its state is unknown
            await conn.close()
            raise
        if conn.broken:
            await conn.close()
            await self._close_idle()
        else:
            self._idle.append(conn)

    async def close(self) -> None:
        await asyncio.gather(*self._flushers, return_exceptions=True)
        await self._close_idle()

    async def _flush(self) -> None:
        try:
            await self._flush_pending()
        finally:  # at once, not in a done callback: a row queued meanwhile would find no commit coming
            self._flushers.discard(asyncio.current_task())

    async def _flush_pending(self) -> None:
        while self._pending:
            batch = [self._pending.popleft() for _ in range(min(BATCH, len(self._pending)))]
            try:
                async with self.connection() as conn:
                    await self._write(conn, batch)
            except AuditUnavailable as exc:  # no connection to be had
                _refuse(batch, exc)
            except Exception as exc:  # a bug must not leave the batch's callers waiting for ever
                logger.exception("audit batch of %d rows failed", len(batch))
                _refuse(batch, AuditUnavailable(str(exc)))
            finally:
                _refuse(batch, AuditUnavailable("the audit writer was stopped"))  # no-op for settled rows

    async def _write(self, conn: psycopg.AsyncConnection, batch: list[_Row]) -> None:
        """The batch in one statement, so one commit; if it is refused, row by row, so that only the
        refused rows' callers fail."""
        try:
            await conn.execute(self._insert(len(batch)), [value for row in batch for value in row.params])
        except psycopg.Error as exc:
            if conn.broken or len(batch) == 1:
                return _refuse(batch, _error(exc))
        else:
            return self._committed(batch)
        for index, row in enumerate(batch):
            try:
                await conn.execute(self._insert(1), row.params)
            except psycopg.Error as exc:
                if conn.broken:
                    return _refuse(batch[index:], _error(exc))
                row.settle(_error(exc))
            else:
                self._committed([row])

    def _committed(self, rows: list[_Row]) -> None:
        self._counts.transactions += 1
        self._counts.rows += len(rows)
        for row in rows:
            row.settle()

    def _insert(self, count: int) -> str:
        """The INSERT of `count` rows in PostgreSQL's own placeholders ($1, $2…), which a raw cursor sends as they
        are: psycopg would otherwise parse a batch's %s marks again at every commit (it caches no statement of
        more than 50 parameters)."""
        if count not in self._sql:
            width = self._width
            rows = (", ".join(f"${row * width + n}" for n in range(1, width + 1)) for row in range(count))
            self._sql[count] = self._head + ", ".join(f"({marks})" for marks in rows)
        return self._sql[count]

    async def _take(self) -> psycopg.AsyncConnection:
        if self._idle:
            return self._idle.pop()
        try:
            conn = await psycopg.AsyncConnection.connect(
                **_connect_kwargs(), autocommit=True, cursor_factory=psycopg.AsyncRawCursor
            )
        except psycopg.Error as exc:
            raise AuditUnavailable(str(exc)) from exc
        if self._local:  # commits return before their WAL reaches disk (docs/audit.md)
            try:
                await conn.execute("SET synchronous_commit = off")
            except psycopg.Error as exc:
                await conn.close()
                raise AuditUnavailable(str(exc)) from exc
        return conn

    async def _close_idle(self) -> None:
        while self._idle:
            await self._idle.pop().close()


def _error(exc: psycopg.Error) -> Exception:
    # autocommit: an IntegrityError refused the row, not the connection (audit_one_outcome, audit/models.py)
    refused = AuditSettled(str(exc)) if isinstance(exc, psycopg.IntegrityError) else AuditUnavailable(str(exc))
    refused.__cause__ = exc
    return refused


def _refuse(rows: list[_Row], error: Exception) -> None:
    for row in rows:
        row.settle(error)


def _connect_kwargs() -> dict[str, Any]:
    params = connections["default"].settings_dict
    kwargs = {
        "dbname": params["NAME"],
        "user": params["USER"],
        "password": params["PASSWORD"],
        "host": params["HOST"],
        "port": params["PORT"],
    }
    return {k: v for k, v in kwargs.items() if v} | {"application_name": f"switchboard-audit-{os.getpid()}"}
