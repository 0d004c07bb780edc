"""Audit rows from async code. On PostgreSQL the row goes straight from the event loop through a few
long-lived autocommit connections, from a column plan made once: no thread hop, no model instance, no
query compilation and no pool checkout on the path of every tool call. Elsewhere (SQLite) the ORM saves
it in a worker thread."""

import asyncio
import os
from functools import cached_property
from typing import Any

import psycopg
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError, IntegrityError, connections
from django.db.models import JSONField
from psycopg.types.json import Jsonb

from audit.models import AuditEvent
from audit.services import audit_event, audit_fields


class AuditUnavailable(Exception):
    """The row could not be written. Callers fail closed: nothing runs, or nothing is shown, unrecorded."""


class AuditSettled(Exception):
    """The call already has its outcome row (the sweep's outcome-unknown, audit/outcomes.py): the first one
    written stands, and this one is not."""


class AuditConnections:
    """At most `size` autocommit connections of one event loop, handed out and back without the checks
    and resets a general pool makes. When one breaks, the idle ones are dropped too (a database restart
    breaks them all), so a single row fails and the next opens a fresh connection."""

    def __init__(self, size: int) -> None:
        self._idle: asyncio.Queue[psycopg.AsyncConnection] = asyncio.Queue()
        self._size = size
        self._opened = 0

    async def execute(self, sql: str, params: list[Any]) -> None:
        conn = await self._take()
        try:
            await conn.execute(sql, params)
        except psycopg.IntegrityError as exc:  # autocommit: the connection is fine, only the row was refused
            self._idle.put_nowait(conn)
            raise AuditSettled(str(exc)) from exc
        except psycopg.Error as exc:
            await self._drop(conn)
            await self.close()
            raise AuditUnavailable(str(exc)) from exc
        self._idle.put_nowait(conn)

    async def close(self) -> None:
        while not self._idle.empty():
            await self._drop(self._idle.get_nowait())

    async def _drop(self, conn: psycopg.AsyncConnection) -> None:
        self._opened -= 1
        await conn.close()

    async def _take(self) -> psycopg.AsyncConnection:
        if not self._idle.empty() or self._opened >= self._size:
            return await self._idle.get()
        self._opened += 1
        try:
            return await psycopg.AsyncConnection.connect(**_connect_kwargs(), autocommit=True)
        except psycopg.OperationalError as exc:
            self._opened -= 1
            raise AuditUnavailable(str(exc)) from exc


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


class AsyncAuditWriter:
    def __init__(self) -> None:
        self._connections: dict[int, AuditConnections] = {}  # per event loop: connections belong to one

    @cached_property
    def _on_postgres(self) -> bool:
        return connections["default"].vendor == "postgresql"

    @cached_property
    def _plan(self) -> tuple[str, list[tuple[str, bool]]]:
        """The INSERT, and per column: the field name, whether it is JSON."""
        ops = connections["default"].ops
        fields = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]
        columns = ", ".join(ops.quote_name(f.column) for f in fields)
        marks = ", ".join(["%s"] * len(fields))
        sql = f"INSERT INTO {ops.quote_name(AuditEvent._meta.db_table)} ({columns}) VALUES ({marks})"
        return sql, [(f.attname, isinstance(f, JSONField)) for f in fields]

    async def record(self, *, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> None:
        if not self._on_postgres:
            event = audit_event(kind=kind, detail=detail, **fields)
            try:
                await database_sync_to_async(event.save, thread_sensitive=False)()
            except IntegrityError as exc:
                raise AuditSettled(str(exc)) from exc
            except DatabaseError as exc:  # locked, or its file unreadable: refused like PostgreSQL's failures
                raise AuditUnavailable(str(exc)) from exc
            return
        row = audit_fields(kind, detail, fields)
        sql, columns = self._plan
        params = [Jsonb(row[name]) if is_json else row[name] for name, is_json in columns]
        loop = id(asyncio.get_running_loop())
        if loop not in self._connections:
            self._connections[loop] = AuditConnections(settings.GATEWAY_AUDIT_POOL_SIZE)
        await self._connections[loop].execute(sql, params)

    async def close(self) -> None:
        """Close this event loop's connections (before the loop ends)."""
        pool = self._connections.pop(id(asyncio.get_running_loop()), None)
        if pool is not None:
            await pool.close()


audit_writer = AsyncAuditWriter()
