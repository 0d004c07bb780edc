"""Audit rows from async code. On PostgreSQL the row goes straight from the event loop through a few
long-lived autocommit connections, with group commit (audit/pg_writer.py, imported only where the default
database is PostgreSQL); on SQLite, the process's one writer thread does the same (audit/sqlite_writer.py)."""

import asyncio
from functools import cached_property
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, JSONField

from audit.models import AuditEvent
from audit.services import audit_fields
from audit.sqlite_writer import SqliteAuditWriter
from audit.writer_errors import AuditCommits, AuditSettled, AuditUnavailable

if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" or TYPE_CHECKING:
    from audit.pg_writer import AuditConnections  # PostgreSQL's alone: psycopg is never loaded on SQLite

__all__ = ["AsyncAuditWriter", "AuditSettled", "AuditUnavailable", "audit_writer"]


class AsyncAuditWriter:
    """The writer of one database: `database`, the default one unless named (a test's own SQLite file)."""

    def __init__(self, database: BaseDatabaseWrapper | None = None) -> None:
        self._database = database
        self._connections: dict[int, AuditConnections] = {}  # per event loop: connections belong to one
        self.commits = AuditCommits()

    @cached_property
    def _on_postgres(self) -> bool:
        return self._db.vendor == "postgresql"

    @cached_property
    def _plan(self) -> tuple[str, list[str], list[tuple[str, bool]]]:
        """The table, its columns, and per column: the field name, whether it is JSON."""
        ops = self._db.ops
        columns = [ops.quote_name(f.column) for f in self._fields]
        table = ops.quote_name(AuditEvent._meta.db_table)
        return table, columns, [(f.attname, isinstance(f, JSONField)) for f in self._fields]

    async def record(self, *, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> None:
        row = audit_fields(kind, detail, fields)
        if not self._on_postgres:
            await self._sqlite.insert([f.get_db_prep_value(row[f.attname], self._db) for f in self._fields])
            return
        await self.pool().insert([row[name] for name, _ in self._plan[2]])

    @cached_property
    def _db(self) -> BaseDatabaseWrapper:
        """The database's wrapper, for its settings and value adapters; it never connects."""
        return self._database or connections["default"]

    @cached_property
    def _fields(self) -> list[Field]:
        return [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]

    @cached_property
    def _sqlite(self) -> SqliteAuditWriter:
        """The process's one SQLite writer, on the database and pragmas Django's connections use."""
        table, columns, _ = self._plan
        params = self._db.settings_dict
        options = params.get("OPTIONS", {})
        return SqliteAuditWriter(
            path=str(params["NAME"]),
            timeout=options.get("timeout", 5),
            init=options.get("init_command", ""),
            table=table,
            columns=columns,
            counts=self.commits,
        )

    def pool(self) -> "AuditConnections":
        """This event loop's connections."""
        loop = id(asyncio.get_running_loop())
        if loop not in self._connections:
            table, columns, plan = self._plan
            self._connections[loop] = AuditConnections(
                settings.GATEWAY_AUDIT_POOL_SIZE,
                table=table,
                columns=columns,
                json=[is_json for _, is_json in plan],
                counts=self.commits,
                local=settings.GATEWAY_AUDIT_COMMIT == "local",
            )
        return self._connections[loop]

    async def close(self) -> None:
        """Close this event loop's connections (before the loop ends), once the commits in flight are done, and the
        SQLite writer's (the next row opens it again)."""
        pool = self._connections.pop(id(asyncio.get_running_loop()), None)
        if pool is not None:
            await pool.close()
        if "_sqlite" in self.__dict__:  # its callers' rows are settled: the thread ends once it has none
            self._sqlite.close()


audit_writer = AsyncAuditWriter()
