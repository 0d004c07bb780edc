"""The one writer of the audit trail: `audit_record` from sync code, `audit_writer.record` from async code."""

import asyncio
import hashlib
import json
from functools import cached_property
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connections
from django.db.models import JSONField
from django.utils import timezone
from psycopg.types.json import Jsonb
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


def _clean_fields(kind: str, detail: dict[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
    clean = {k: text_safe(v) if isinstance(v, str) else v for k, v in fields.items()}
    return clean | {"kind": kind, "detail": json_safe(detail or {})}


def audit_event(*, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> AuditEvent:
    """An unsaved event with every string made storable."""
    return AuditEvent(**_clean_fields(kind, detail, fields))


def audit_record(*, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> AuditEvent:
    event = audit_event(kind=kind, detail=detail, **fields)
    event.save()
    return event


class AsyncAuditWriter:
    """Writes from the event loop. On PostgreSQL an async psycopg pool inserts the row itself, from a
    column plan made once: no thread hop, no model instance and no query compilation on the path of
    every tool call. Elsewhere (SQLite) the ORM saves it in a worker thread."""

    def __init__(self) -> None:
        self._pools: dict[int, AsyncConnectionPool] = {}

    @cached_property
    def _on_postgres(self) -> bool:
        return connections["default"].vendor == "postgresql"

    @cached_property
    def _plan(self) -> tuple[str, list[tuple[str, Any, bool]]]:
        """The INSERT, and per column: the field name, its default, whether it is JSON."""
        ops = connections["default"].ops
        fields = [f for f in AuditEvent._meta.concrete_fields if not f.primary_key]
        columns = ", ".join(ops.quote_name(f.column) for f in fields)
        marks = ", ".join(["%s"] * len(fields))
        sql = f"INSERT INTO {ops.quote_name(AuditEvent._meta.db_table)} ({columns}) VALUES ({marks})"
        return sql, [(f.attname, f.get_default(), isinstance(f, JSONField)) for f in fields]

    async def record(self, *, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> None:
        if not self._on_postgres:
            event = audit_event(kind=kind, detail=detail, **fields)
            await database_sync_to_async(event.save, thread_sensitive=False)()
            return
        row = _clean_fields(kind, detail, fields) | {"created_at": timezone.now()}
        sql, columns = self._plan
        params = [
            Jsonb(row.get(name, default)) if is_json else row.get(name, default) for name, default, is_json in columns
        ]
        async with (await self._pool()).connection() as conn:
            await conn.execute(sql, params)

    async def _pool(self) -> AsyncConnectionPool:
        loop = id(asyncio.get_running_loop())  # an async pool belongs to the loop that opened it
        if loop not in self._pools:
            params = connections["default"].settings_dict
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
