"""The audit trail is append-only and tamper-evident: triggers refuse changes, MACs and checkpoints expose
the changes made behind the app's back, and retention is the one deleter that leaves the trail verifiable."""

import contextlib
import gzip
import io
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit import integrity
from audit.integrity import (
    ROW_FIELDS,
    SERVER_FIELDS,
    SIGNED_FIELDS,
    STORED_FIELDS,
    TEAM_FIELDS,
    VerifyReport,
    _canonical,
    _row_payload,
    audit_verify,
    checkpoint_create,
)
from audit.models import DEFAULT_TEAM, SEAL_SERVERS, SEAL_TEAMS, AuditCheckpoint, AuditEvent
from audit.retention import audit_prune
from audit.services import audit_record
from audit.writer import audit_writer
from tests.conftest import needs
from tests.helpers import audit_mark, run

LATER = timedelta(minutes=5)  # a checkpoint taken this far ahead seals every row written so far


def seal_all() -> AuditCheckpoint:
    checkpoint = checkpoint_create(now=timezone.now() + LATER)
    assert checkpoint is not None
    return checkpoint


def some_rows(count: int = 3) -> list[AuditEvent]:
    return [
        audit_record(kind="completed", request_id=uuid.uuid4(), tool=f"t{i}", duration_ms=1.25, detail={"n": 1e20})
        for i in range(count)
    ]


@contextlib.contextmanager
def behind_the_apps_back() -> Iterator:
    """A superuser's session with triggers off (session_replication_role), as an intruder would have."""
    needs(connection.vendor == "postgresql", "triggers are PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            yield cursor
        finally:
            cursor.execute("SET session_replication_role = origin")


def refused(sql: str, params: list) -> str:
    with pytest.raises(DatabaseError) as error, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
    return str(error.value)


def test_update_on_the_audit_table_fails_on_postgresql(db):
    needs(connection.vendor == "postgresql", "triggers are PostgreSQL's")
    row = some_rows(1)[0]
    message = refused("UPDATE audit_auditevent SET tool = 'rewritten' WHERE id = %s", [row.id])
    assert "the audit trail is append-only: UPDATE on audit_auditevent refused" in message
    assert AuditEvent.objects.get(id=row.id).tool == "t0"


def test_delete_on_the_audit_table_fails_on_postgresql(db):
    needs(connection.vendor == "postgresql", "triggers are PostgreSQL's")
    row = some_rows(1)[0]
    message = refused("DELETE FROM audit_auditevent WHERE id = %s", [row.id])
    assert "the audit trail is append-only: DELETE on audit_auditevent refused" in message
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(id=row.id).delete()  # the ORM is no way round it
    assert AuditEvent.objects.filter(id=row.id).exists()


def test_checkpoints_can_be_neither_changed_nor_deleted(db):
    needs(connection.vendor == "postgresql", "triggers are PostgreSQL's")
    some_rows(1)
    checkpoint = seal_all()
    assert "UPDATE on audit_auditcheckpoint refused" in refused(
        "UPDATE audit_auditcheckpoint SET event_count = 0 WHERE id = %s", [checkpoint.id]
    )
    assert "DELETE on audit_auditcheckpoint refused" in refused(
        "DELETE FROM audit_auditcheckpoint WHERE id = %s", [checkpoint.id]
    )


def test_an_untouched_trail_verifies(db):
    some_rows()
    seal_all()
    some_rows(2)  # newer than the checkpoint: their MACs alone
    out = io.StringIO()
    call_command("audit_verify", stdout=out)
    assert out.getvalue().startswith("Audit trail intact:")
    assert "2 rows newer than the last checkpoint" in out.getvalue()


def test_a_range_read_a_few_rows_at_a_time_seals_as_one_read_at_once(db, monkeypatch):
    """The seal reads SEAL_CHUNK rows at a time (so that the web process's loop is not held up): the digest and the
    verification do not depend on where the chunks break."""
    some_rows(23)
    monkeypatch.setattr(integrity, "SEAL_CHUNK", 5)
    with CaptureQueriesContext(connection) as queries:
        chunked = seal_all()
    reads = [q for q in queries if q["sql"].startswith("SELECT") and 'FROM "audit_auditevent"' in q["sql"]]
    assert len(reads) > chunked.event_count // 5, "the seal read more than 5 rows at a time"
    whole = integrity._RangeDigest()
    for row in integrity._rows(chunked.first_event_id, chunked.last_event_id, chunk=10_000):
        whole.add(row)
    assert (chunked.event_count, chunked.digest) == (whole.count, whole.hexdigest())
    assert chunked.event_count >= 23
    assert audit_verify().intact


def test_rows_from_the_async_writer_verify_with_any_text(db):
    async def write() -> None:
        await audit_writer.record(
            kind="completed", request_id=uuid.uuid4(), tool="x\x00y\ud800", detail={"f": 0.1, "big": 1e20}
        )
        await audit_writer.close()

    mark = audit_mark()
    run(write)
    assert AuditEvent.objects.filter(id__gt=mark).count() == 1
    assert audit_verify().intact


def test_audit_verify_names_the_row_altered_behind_the_apps_back(db):
    rows = some_rows()
    seal_all()
    victim = rows[1]
    with behind_the_apps_back() as cursor:
        cursor.execute("UPDATE audit_auditevent SET outcome = 'ok', tool = 'innocent' WHERE id = %s", [victim.id])
        try:
            with pytest.raises(CommandError) as error:
                call_command("audit_verify")
        finally:
            restore = "UPDATE audit_auditevent SET outcome = '', tool = %s WHERE id = %s"
            cursor.execute(restore, [victim.tool, victim.id])
    assert f"first tampered row: event {victim.id};" in str(error.value)
    assert audit_verify().intact  # put back as it was, it verifies again


PERSON = {"person_issuer": "https://idp.test", "person_subject": "grace", "person_name": "Grace", "client_id": "desk"}


def altered_report(victim: AuditEvent, column: str, value: Any) -> VerifyReport:
    """What audit_verify says while `column` of the row holds `value`, set behind the app's back (then put back)."""
    original = AuditEvent.objects.filter(id=victim.id).values_list(column, flat=True).get()
    with behind_the_apps_back() as cursor:
        cursor.execute(f"UPDATE audit_auditevent SET {column} = %s WHERE id = %s", [value, victim.id])
        try:
            return audit_verify()
        finally:
            cursor.execute(f"UPDATE audit_auditevent SET {column} = %s WHERE id = %s", [original, victim.id])


@pytest.mark.parametrize("seal", [0, SEAL_TEAMS], ids=["before-teams", "now"])
@pytest.mark.parametrize(
    ("column", "value"),
    [("person_name", "Someone Else"), ("person_subject", "mallory"), ("person_subject", ""), ("client_id", "")],
)
def test_the_person_a_row_names_is_sealed_with_it(db, column, value, seal):
    """A row naming a person is sealed over the person too (version 2, and 3): changing who, or erasing them so
    the row reads as one from before people existed, is tampering."""
    victim = audit_record(kind="completed", request_id=uuid.uuid4(), tool="echo", seal=seal, **PERSON)
    seal_all()
    assert audit_verify().intact
    assert altered_report(victim, column, value).first_bad_event == victim.id
    assert audit_verify().intact


def test_a_row_sealed_before_teams_keeps_its_seal_reads_as_the_default_team_and_verifies(db):
    """A row written before teams (seal 0) is sealed by its content: version 1 without a person, 2 with one.
    Nothing rewrote it, so it names no team of its own and reads as the default team."""
    plain = audit_record(kind="completed", request_id=uuid.uuid4(), tool="echo", seal=0)
    named = audit_record(kind="completed", request_id=uuid.uuid4(), tool="echo", seal=0, **PERSON)
    stored = AuditEvent.objects.filter(id__in=[plain.id, named.id]).order_by("id")
    values = stored.values(*STORED_FIELDS)
    assert _row_payload(values[0]) == _canonical([values[0][name] for name in SIGNED_FIELDS])
    assert _row_payload(values[1]) == _canonical([values[1][name] for name in ROW_FIELDS])
    assert [(row.seal, row.team, row.team_slug) for row in stored] == [(0, "", DEFAULT_TEAM)] * 2
    assert audit_verify().intact


def test_a_new_row_carries_its_team_and_virtual_server_by_value_under_seal_version_4(db):
    made = audit_record(kind="completed", tool="echo", team="payments", server="support")
    row = AuditEvent.objects.get(id=made.id)
    values = AuditEvent.objects.filter(id=row.id).values(*STORED_FIELDS).get()
    assert (row.seal, row.team, row.team_slug, row.server) == (SEAL_SERVERS, "payments", "payments", "support")
    assert _row_payload(values) == _canonical([SEAL_SERVERS, *(values[name] for name in SERVER_FIELDS)])
    assert audit_verify().intact


def test_a_row_sealed_at_version_3_keeps_its_seal_without_a_server_and_verifies(db):
    row = audit_record(kind="completed", request_id=uuid.uuid4(), tool="echo", team="payments", seal=SEAL_TEAMS)
    values = AuditEvent.objects.filter(id=row.id).values(*STORED_FIELDS).get()
    assert _row_payload(values) == _canonical([SEAL_TEAMS, *(values[name] for name in TEAM_FIELDS)])
    seal_all()
    assert audit_verify().intact


def test_a_new_row_of_no_team_reads_as_none_not_the_default(db):
    """A token refused at the door, a locked sign-in: rows no team's agent wrote are no team's."""
    row = AuditEvent.objects.get(id=audit_record(kind="denied", error_code="INVALID_TOKEN").id)
    assert (row.seal, row.team_slug) == (SEAL_SERVERS, "")


NEW_ROW, OLD_ROW = {"team": "payments", "server": "support"}, {"seal": 0}  # a row written now, one before teams


@pytest.mark.parametrize(
    ("made", "column", "value"),
    [
        (NEW_ROW, "team", "other-team"),
        (NEW_ROW, "team", ""),
        (NEW_ROW, "seal", 0),
        (NEW_ROW, "seal", SEAL_TEAMS),
        (NEW_ROW, "seal", SEAL_SERVERS + 1),
        (NEW_ROW, "server", "other-server"),
        (NEW_ROW, "server", ""),
        (OLD_ROW, "team", "payments"),
    ],
    ids=[
        "new-moved",
        "new-emptied",
        "new-as-old",
        "new-as-before-servers",
        "new-unknown-seal",
        "new-other-server",
        "new-server-emptied",
        "old-given-a-team",
    ],
)
def test_changing_a_rows_team_server_or_its_seal_version_breaks_its_verification(db, made, column, value):
    """Moving a new row to another team or out of every team, or to another virtual server or none, making it pass
    as a row from before teams or servers (whose team or server is not sealed), or giving a row from before teams a
    team, is tampering."""
    victim = audit_record(kind="completed", request_id=uuid.uuid4(), tool="echo", **made)
    seal_all()
    assert audit_verify().intact
    assert altered_report(victim, column, value).first_bad_event == victim.id
    assert audit_verify().intact


def test_a_row_deleted_inside_a_checkpointed_range_is_detected(db):
    rows = some_rows()
    checkpoint = seal_all()
    victim = rows[1]
    saved = AuditEvent.objects.filter(id=victim.id).values().get()
    with behind_the_apps_back() as cursor:
        cursor.execute("DELETE FROM audit_auditevent WHERE id = %s", [victim.id])
        try:
            report = audit_verify()
        finally:
            AuditEvent.objects.bulk_create([AuditEvent(**saved)])
    assert report.problems == [
        f"checkpoint {checkpoint.id} (events {checkpoint.first_event_id}..{checkpoint.last_event_id}): "
        f"{checkpoint.event_count - 1} rows now, {checkpoint.event_count} when sealed, or not the same ones: "
        "a row was deleted, inserted or renumbered"
    ]
    assert audit_verify().intact


def test_a_forged_row_fails_its_mac(db):
    needs(connection.vendor == "postgresql", "triggers are PostgreSQL's")
    real = some_rows(1)[0]
    forged = AuditEvent.objects.create(kind="completed", tool="forged", mac=real.mac)  # no key, so a copied MAC
    report = audit_verify()
    assert report.first_bad_event == forged.id
    with behind_the_apps_back() as cursor:
        cursor.execute("DELETE FROM audit_auditevent WHERE id = %s", [forged.id])
    assert audit_verify().intact


def test_retention_deletes_only_checkpointed_old_rows_archives_them_and_leaves_a_verifiable_trail(db, tmp_path):
    old = some_rows(4)
    checkpoint = seal_all()
    newer = some_rows(2)
    with override_settings(GATEWAY_AUDIT_ARCHIVE_DIR=str(tmp_path), GATEWAY_AUDIT_PRUNE_BATCH=3):
        result = audit_prune(older_than=-LATER - timedelta(minutes=1))  # the checkpoint counts as old enough
    assert result is not None and result.through_event == checkpoint.last_event_id
    assert not AuditEvent.objects.filter(id__lte=checkpoint.last_event_id).exists()
    assert AuditEvent.objects.filter(id__in=[r.id for r in newer]).count() == 2
    archived = [json.loads(line) for line in gzip.open(result.archive, "rt")]
    assert len(archived) == result.deleted and {r.id for r in old} <= {row["id"] for row in archived}
    assert all(row["mac"] for row in archived)
    marker = AuditEvent.objects.filter(detail__action="audit_pruned").latest("id")
    assert marker.actor == "retention" and marker.detail["through_event"] == checkpoint.last_event_id
    report = audit_verify()
    assert report.intact and report.pruned_through == checkpoint.last_event_id
    assert audit_prune(older_than=-LATER - timedelta(minutes=1)) is None  # nothing left to do


def test_a_checkpoint_holds_only_settled_rows(db):
    some_rows(1)
    seal_all()
    some_rows(1)
    assert checkpoint_create() is None  # just written: a transaction open now could still add rows before it


def test_the_periodic_tasks_seal_what_settled_and_keep_everything_when_retention_is_off(db):
    from audit.tasks import audit_checkpoint, audit_retention

    some_rows(2)
    with override_settings(GATEWAY_AUDIT_CHECKPOINT_SETTLE_SECONDS=-1, GATEWAY_AUDIT_CHECKPOINT_MAX_ROWS=1):
        made = audit_checkpoint()  # one checkpoint per row here, until nothing is left
    assert made >= 2 and checkpoint_create(now=timezone.now() + LATER) is None
    with override_settings(GATEWAY_AUDIT_RETENTION_DAYS=0):
        assert audit_retention() == 0
    assert audit_verify().intact
