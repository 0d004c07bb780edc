"""Retention: the one path that deletes audit rows.

It deletes whole checkpointed ranges only, so what remains still verifies, and it first writes a sealed row
(`audit_pruned`, naming the last event it deletes through) that tells `audit_verify` the gap is deliberate.
Rows go in small batches, each its own short transaction, oldest first: writers append at the other end of
the table and never wait. On PostgreSQL each batch sets `switchboard.audit_prune` for its transaction only,
the one thing the append-only trigger lets through. With GATEWAY_AUDIT_ARCHIVE_DIR set, each batch is
appended, MACs included, to a gzipped JSON Lines file before it is deleted.
"""

import gzip
import json
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils import timezone

from audit.integrity import PRUNED, STORED_FIELDS
from audit.models import AuditCheckpoint, AuditEvent
from audit.services import audit_record


@dataclass(frozen=True)
class PruneResult:
    through_event: int
    deleted: int
    archive: Path | None


def _delete_batch(through: int, archive: Path | None) -> int:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL switchboard.audit_prune = 'on'")
        rows = list(
            AuditEvent.objects.filter(id__lte=through)
            .order_by("id")
            .values("id", "mac", *STORED_FIELDS)[: settings.GATEWAY_AUDIT_PRUNE_BATCH]
        )
        if not rows:
            return 0
        if archive is not None:
            with gzip.open(archive, "at", encoding="utf-8") as out:
                out.writelines(json.dumps(row, cls=DjangoJSONEncoder) + "\n" for row in rows)
        AuditEvent.objects.filter(id__in=[row["id"] for row in rows]).delete()
    return len(rows)


def audit_prune(*, older_than: timedelta, actor: str = "retention") -> PruneResult | None:
    """Delete (or archive, then delete) the checkpointed rows older than `older_than`; None if none are."""
    cutoff = timezone.now() - older_than
    checkpoint = AuditCheckpoint.objects.filter(events_before__lte=cutoff).order_by("-last_event_id").first()
    if checkpoint is None or not AuditEvent.objects.filter(id__lte=checkpoint.last_event_id).exists():
        return None
    through = checkpoint.last_event_id
    archive = None
    if settings.GATEWAY_AUDIT_ARCHIVE_DIR:
        archive = Path(settings.GATEWAY_AUDIT_ARCHIVE_DIR) / f"audit-through-{through}.jsonl.gz"
        archive.parent.mkdir(parents=True, exist_ok=True)
    audit_record(
        kind=AuditEvent.Kind.ADMIN_CHANGE,
        actor=actor,
        detail={
            "action": PRUNED,
            "through_event": through,
            "checkpoint": checkpoint.pk,
            "older_than_days": older_than / timedelta(days=1),
            "archive": archive.name if archive else None,
        },
    )
    deleted = 0
    while batch := _delete_batch(through, archive):
        deleted += batch
    return PruneResult(through_event=through, deleted=deleted, archive=archive)
