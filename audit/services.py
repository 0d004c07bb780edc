"""The one writer of the audit trail: `audit_record` from sync code, `audit_writer.record` from async code."""

import asyncio
import hashlib
import json
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connections
from psycopg_pool import AsyncConnectionPool

from audit.models import AuditEvent


def text_safe(value: str) -> str:
    """A string every database can store: NUL spelled out, lone surrogates escaped rather than lost."""
    return value.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")


def json_safe(value: Any) -> Any:
    if isinstance(value, str):
        return text_safe(value)
    if isinstance(value, dict):
        return {text_safe(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def canonical_sha256(value: Any) -> str:
    """SHA-256 of the canonical JSON form (sorted keys, no spaces), stable across processes."""
    encoded = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


def audit_event(*, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> AuditEvent:
    """An unsaved event with every string made storable."""
    clean = {k: text_safe(v) if isinstance(v, str) else v for k, v in fields.items()}
    return AuditEvent(kind=kind, detail=json_safe(detail or {}), **clean)


def audit_record(*, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> AuditEvent:
    event = audit_event(kind=kind, detail=detail, **fields)
    event.save()
    return event


class AsyncAuditWriter:
    """Writes from the event loop. On PostgreSQL an async psycopg pool inserts the row itself: no thread
    hop and no query compilation on the path of every tool call. Elsewhere the ORM runs in a thread."""

    def __init__(self) -> None:
        self._pools: dict[int, AsyncConnectionPool] = {}
        self._fields = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]

    async def record(self, *, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> None:
        event = audit_event(kind=kind, detail=detail, **fields)
        db = connections["default"]
        if db.vendor != "postgresql":
            await database_sync_to_async(event.save, thread_sensitive=False)()
            return
        params = [f.get_db_prep_save(f.pre_save(event, add=True), db) for f in self._fields]
        async with (await self._pool(db)).connection() as conn:
            await conn.execute(self._insert_sql(db), params)

    def _insert_sql(self, db: Any) -> str:
        columns = ", ".join(db.ops.quote_name(f.column) for f in self._fields)
        marks = ", ".join(["%s"] * len(self._fields))
        return f"INSERT INTO {db.ops.quote_name(AuditEvent._meta.db_table)} ({columns}) VALUES ({marks})"

    async def _pool(self, db: Any) -> AsyncConnectionPool:
        loop = id(asyncio.get_running_loop())  # an async pool belongs to the loop that opened it
        if loop not in self._pools:
            params = db.settings_dict
            kwargs = {
                "dbname": params["NAME"],
                "user": params["USER"],
                "password": params["PASSWORD"],
                "host": params["HOST"],
                "port": params["PORT"] or None,
            }
            # Autocommit: each row is one round trip, with nothing to commit or reset on return to the pool.
            pool = AsyncConnectionPool(
                kwargs={k: v for k, v in kwargs.items() if v} | {"autocommit": True},
                min_size=1,
                max_size=settings.GATEWAY_AUDIT_POOL_SIZE,
                open=False,
            )
            self._pools[loop] = pool
            await pool.open()
        return self._pools[loop]


audit_writer = AsyncAuditWriter()
