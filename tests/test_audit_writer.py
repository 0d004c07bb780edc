"""The async audit writer's group commit: rows that queue while a commit is in flight share the next one,
each caller still returns only once its own row is committed, and a refused row fails its caller alone."""

import asyncio
import uuid

from django.db import connection
from django.test import override_settings

from audit.integrity import audit_verify
from audit.models import AuditEvent
from audit.pg_writer import BATCH
from audit.writer import AsyncAuditWriter, AuditSettled, AuditUnavailable
from tests.conftest import needs
from tests.helpers import audit_mark, orm, run, until


def on_postgres() -> None:
    needs(connection.vendor == "postgresql", "group commit is the PostgreSQL writer's")


def transactions_since(mark: int) -> int:
    """How many transactions wrote the rows after `mark`: rows of one transaction share its xmin."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(DISTINCT xmin::text) FROM audit_auditevent WHERE id > %s", [mark])
        return cursor.fetchone()[0]


def completions(writer: AsyncAuditWriter, request_ids: list[uuid.UUID], **fields: object) -> asyncio.Future:
    return asyncio.gather(
        *(writer.record(kind="completed", request_id=r, tool="t", **fields) for r in request_ids),
        return_exceptions=True,
    )


def test_concurrent_rows_share_commits_of_at_most_a_batch_and_every_one_verifies(db):
    on_postgres()
    writer, request_ids = AsyncAuditWriter(), [uuid.uuid4() for _ in range(100)]

    async def write() -> list[object]:
        try:
            return await completions(writer, request_ids, detail={"big": 1e20})
        finally:
            await writer.close()

    mark = audit_mark()
    assert run(write) == [None] * 100
    written = AuditEvent.objects.filter(id__gt=mark)
    assert sorted(written.values_list("request_id", flat=True)) == sorted(request_ids)
    assert transactions_since(mark) == writer.commits.transactions == 2  # 100 rows: a full batch, then the rest
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM audit_auditevent WHERE id > %s GROUP BY xmin::text) t",
            [mark],
        )
        assert cursor.fetchone()[0] == BATCH
    assert writer.commits.rows == 100
    assert audit_verify().intact


def test_rows_written_one_after_another_each_commit_at_once(db):
    on_postgres()
    writer = AsyncAuditWriter()

    async def write() -> None:
        for _ in range(3):
            await writer.record(kind="completed", request_id=uuid.uuid4())
        await writer.close()

    mark = audit_mark()
    run(write)
    assert transactions_since(mark) == writer.commits.transactions == 3


def test_a_settled_row_fails_alone_and_the_rest_of_its_batch_commits(db):
    on_postgres()
    writer, settled, others = AsyncAuditWriter(), uuid.uuid4(), [uuid.uuid4() for _ in range(5)]

    async def write() -> tuple[list[object], int, list[object]]:
        try:
            await writer.record(kind="completed", request_id=settled, outcome="unknown")
            alike = await completions(writer, [uuid.uuid4() for _ in range(6)])  # the same shape: one commit
            commits = writer.commits.transactions
            return alike, commits, await completions(writer, [*others[:2], settled, *others[2:]])
        finally:
            await writer.close()

    alike, commits, results = run(write)
    assert alike == [None] * 6 and commits == 2
    refused = results.pop(2)
    assert isinstance(refused, AuditSettled)
    assert 'duplicate key value violates unique constraint "audit_one_outcome"' in str(refused)
    assert results == [None] * 5
    assert AuditEvent.objects.filter(request_id__in=others).count() == 5
    assert AuditEvent.objects.filter(request_id=settled).values_list("outcome", flat=True).get() == "unknown"
    assert audit_verify().intact


def test_a_row_the_database_refuses_for_its_value_fails_alone(db):
    on_postgres()
    writer, others = AsyncAuditWriter(), [uuid.uuid4() for _ in range(3)]

    async def write() -> list[object]:
        try:
            return await asyncio.gather(
                completions(writer, others[:1]),
                writer.record(kind="completed", request_id=uuid.uuid4(), upstream="u" * 33),
                completions(writer, others[1:]),
                return_exceptions=True,
            )
        finally:
            await writer.close()

    mark = audit_mark()
    first, refused, rest = run(write)
    assert isinstance(refused, AuditUnavailable)
    assert "value too long for type character varying(32)" in str(refused)
    assert first + rest == [None] * 3
    assert sorted(AuditEvent.objects.filter(id__gt=mark).values_list("request_id", flat=True)) == sorted(others)


def test_a_broken_connection_fails_its_batch_and_the_next_row_reconnects(db):
    on_postgres()
    writer = AsyncAuditWriter()

    def terminate(pid: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])

    def gone(pid: int) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            return cursor.fetchone()[0] == 0

    async def write() -> list[object]:
        try:
            await writer.record(kind="completed", request_id=uuid.uuid4())
            async with writer.pool().connection() as conn:
                pid = conn.info.backend_pid
            await orm(lambda: terminate(pid))
            await until(lambda: orm(lambda: gone(pid)))
            failed = await completions(writer, [uuid.uuid4() for _ in range(4)])
            await writer.record(kind="completed", request_id=uuid.uuid4())  # on a fresh connection
            return failed
        finally:
            await writer.close()

    mark = audit_mark()
    failed = run(write)
    assert [type(error) for error in failed] == [AuditUnavailable] * 4
    assert all("terminating connection due to administrator command" in str(error) for error in failed)
    assert AuditEvent.objects.filter(id__gt=mark).count() == 2


def test_local_commit_turns_synchronous_commit_off_on_the_audit_connections(db):
    on_postgres()

    async def synchronous_commit() -> str:
        writer = AsyncAuditWriter()
        try:
            await writer.record(kind="completed", request_id=uuid.uuid4())
            async with writer.pool().connection() as conn:
                cursor = await conn.execute("SHOW synchronous_commit")
                return (await cursor.fetchone())[0]
        finally:
            await writer.close()

    with override_settings(GATEWAY_AUDIT_COMMIT="local"):
        assert run(synchronous_commit) == "off"
    assert run(synchronous_commit) == "on"
