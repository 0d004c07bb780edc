"""Tamper evidence for the audit trail: an HMAC on every row, and signed checkpoints over ranges of rows.

Why not a hash chain: chaining each row to its predecessor makes every insert wait for the one before it
(one lock on the chain's head across all web processes), and two rows are written on the path of every
tool call. A per-row HMAC is computed by its writer alone, so writers stay concurrent. What a chain adds,
that no row was deleted, inserted or reordered, comes from checkpoints instead: a periodic task signs the
digest of the rows written since the previous checkpoint, chained to that checkpoint's MAC. A row altered
is caught by its own MAC; a row deleted, inserted or renumbered inside a checkpointed range by the range's
digest; a checkpoint removed by the chain. Rows newer than the last checkpoint rest on their MACs alone.

The keys (GATEWAY_AUDIT_KEYS) live with the gateway's processes, not in the database: someone who can
write the table but has no key cannot make a row or a checkpoint that verifies.
"""

import hashlib
import hmac
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.models import SEAL_SERVERS, AuditCheckpoint, AuditEvent
from audit.selectors import STREAM_CHUNK, audit_stream
from gateway_project.lib.signing import KeyRing

# What a row's MAC covers (version 1). A column added later joins a new version, never this list.
SIGNED_FIELDS = (
    "created_at",
    "kind",
    "request_id",
    "trace_id",
    "agent_id",
    "agent_name",
    "session_id",
    "transport",
    "upstream",
    "tool",
    "exposed_name",
    "arguments_sha256",
    "outcome",
    "error_code",
    "error_detail",
    "duration_ms",
    "response_bytes",
    "actor",
    "detail",
)
# Version 2: a row that names a person is sealed over these too (a row of either version cannot pass as the
# other: the payloads differ in length).
PERSON_FIELDS = ("person_issuer", "person_subject", "person_name", "client_id")
ROW_FIELDS = (*SIGNED_FIELDS, *PERSON_FIELDS)
# Version 3 (SEAL_TEAMS, the row's `seal` column says so): every field above and the team, whatever is empty,
# the version itself first. A row's version is no longer guessed from its content: a row of one version made
# to look like another (its team or its seal changed) does not match its MAC.
TEAM_FIELDS = (*ROW_FIELDS, "team")
# Version 4 (SEAL_SERVERS): those and the virtual server the call came through.
SERVER_FIELDS = (*TEAM_FIELDS, "server")
STORED_FIELDS = (*SERVER_FIELDS, "seal")  # what verifying a row reads
# Without Celery, the web process seals in a thread of its own (audit/tasks.py), and turning a fetched chunk into
# rows holds the GIL that the serving loop's thread wants back: 5,000 rows at a time held it up to 150 ms, a few
# hundred keep it to milliseconds (bench/seal_stall.py).
SEAL_CHUNK = 250
PRUNED = "audit_pruned"  # the action of the retention row that marks rows as deleted on purpose


@cache
def audit_key_ring() -> KeyRing:
    return KeyRing.parse(settings.GATEWAY_AUDIT_KEYS)


def _plain(value: Any) -> Any:
    """One spelling per value, whatever the database gives back: PostgreSQL's jsonb turns 1e20 into
    100000000000000000000, UUIDs come back as objects, datetimes in UTC."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _canonical(values: Any) -> bytes:
    text = json.dumps(_plain(values), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def _mac(kid: str, payload: bytes) -> str:
    secret = audit_key_ring().secret(kid)
    return f"{kid}:{hmac.new(secret or b'', payload, hashlib.sha256).hexdigest()}"


def _mac_valid(mac: str, payload: bytes) -> bool:
    kid, _, _ = mac.partition(":")
    if audit_key_ring().secret(kid) is None:
        return False
    return hmac.compare_digest(_mac(kid, payload), mac)


def _row_payload(row: Mapping[str, Any]) -> bytes:
    if isinstance(row.get("request_id"), str):
        row = {**row, "request_id": uuid.UUID(row["request_id"])}  # the spelling the database gives back
    if row.get("seal"):
        fields = SERVER_FIELDS if row["seal"] >= SEAL_SERVERS else TEAM_FIELDS
        return _canonical([row["seal"], *(row.get(name) for name in fields)])
    fields = ROW_FIELDS if any(row.get(name) for name in PERSON_FIELDS) else SIGNED_FIELDS
    # No row sealed before teams had one: a team found on such a row was put there afterwards.
    return _canonical([row.get(name) for name in fields] + ([row["team"]] if row.get("team") else []))


def row_seal(row: Mapping[str, Any]) -> str:
    """The MAC of a row about to be written, from the newest key."""
    return _mac(audit_key_ring().signing_kid, _row_payload(row))


def _checkpoint_payload(checkpoint: AuditCheckpoint) -> bytes:
    return _canonical(
        [
            checkpoint.first_event_id,
            checkpoint.last_event_id,
            checkpoint.events_before,
            checkpoint.event_count,
            checkpoint.digest,
            checkpoint.previous_mac,
        ]
    )


def _rows(first: int, last: int | None, chunk: int = STREAM_CHUNK) -> Iterator[dict[str, Any]]:
    """Rows with first <= id <= last (no bound: to the end), in id order, read `chunk` at a time."""
    rows = AuditEvent.objects.filter(id__gte=first)
    if last is not None:
        rows = rows.filter(id__lte=last)
    return audit_stream(rows=rows, fields=["mac", *STORED_FIELDS], oldest_first=True, chunk=chunk)


class _RangeDigest:
    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.count = 0

    def add(self, row: Mapping[str, Any]) -> bytes:
        payload = _row_payload(row)
        self._hash.update(b"%d:%s\n" % (row["id"], hashlib.sha256(payload).hexdigest().encode()))
        self.count += 1
        return payload

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def checkpoint_create(*, now: datetime | None = None) -> AuditCheckpoint | None:
    """Seal the rows written since the last checkpoint and at least a settling time ago (so that no
    transaction still open can add a row inside the range afterwards). None when there is nothing new."""
    before = (now or timezone.now()) - timedelta(seconds=settings.GATEWAY_AUDIT_CHECKPOINT_SETTLE_SECONDS)
    previous = AuditCheckpoint.objects.order_by("-last_event_id").first()
    first = previous.last_event_id + 1 if previous else 1
    settled = AuditEvent.objects.filter(id__gte=first, created_at__lt=before).order_by("-id").first()
    if settled is None:
        return None
    last = min(settled.id, first + settings.GATEWAY_AUDIT_CHECKPOINT_MAX_ROWS - 1)
    digest = _RangeDigest()
    for row in _rows(first, last, chunk=SEAL_CHUNK):
        digest.add(row)
    checkpoint = AuditCheckpoint(
        first_event_id=first,
        last_event_id=last,
        events_before=before,
        event_count=digest.count,
        digest=digest.hexdigest(),
        previous_mac=previous.mac if previous else "",
    )
    checkpoint.mac = _mac(audit_key_ring().signing_kid, _checkpoint_payload(checkpoint))
    try:
        with transaction.atomic():
            checkpoint.save()
    except IntegrityError:
        return None  # another run sealed this range first
    return checkpoint


@dataclass
class VerifyReport:
    rows_checked: int = 0
    checkpoints_checked: int = 0
    rows_after_last_checkpoint: int = 0
    pruned_through: int = 0
    outcomes_unknown: int = 0  # calls settled by the sweep (audit/outcomes.py): not tampering, not a result
    problems: list[str] = field(default_factory=list)
    first_bad_event: int | None = None

    @property
    def intact(self) -> bool:
        return not self.problems

    def altered(self, event_id: int, why: str) -> None:
        if self.first_bad_event is None or event_id < self.first_bad_event:
            self.first_bad_event = event_id
        self.problems.append(f"event {event_id}: {why}")


def _pruned_through(report: VerifyReport) -> int:
    """How far retention deleted, by its own sealed rows; a forged one counts as tampering."""
    through = 0
    for row in AuditEvent.objects.filter(kind=AuditEvent.Kind.ADMIN_CHANGE, detail__action=PRUNED).values(
        "id", "mac", *STORED_FIELDS
    ):
        if not _mac_valid(row["mac"], _row_payload(row)):
            report.altered(row["id"], "a retention record that does not match its MAC")
            continue
        through = max(through, int(row["detail"].get("through_event", 0)))
    return through


def _check_range(report: VerifyReport, first: int, last: int | None) -> _RangeDigest:
    digest = _RangeDigest()
    for row in _rows(first, last):
        report.rows_checked += 1
        if not _mac_valid(row["mac"], digest.add(row)):
            report.altered(row["id"], "altered after it was written (its content does not match its MAC)")
    return digest


def audit_verify() -> VerifyReport:
    """Check every checkpoint's signature and chain, every row's MAC, and every checkpointed range's
    digest; report each problem, and the first altered row."""
    report = VerifyReport()
    report.pruned_through = _pruned_through(report)
    previous: AuditCheckpoint | None = None
    for checkpoint in AuditCheckpoint.objects.order_by("first_event_id").iterator():
        report.checkpoints_checked += 1
        name = f"checkpoint {checkpoint.pk} (events {checkpoint.first_event_id}..{checkpoint.last_event_id})"
        if not _mac_valid(checkpoint.mac, _checkpoint_payload(checkpoint)):
            report.problems.append(f"{name}: altered (its content does not match its MAC)")
        expected_first = previous.last_event_id + 1 if previous else checkpoint.first_event_id
        if checkpoint.previous_mac != (previous.mac if previous else "") or checkpoint.first_event_id != expected_first:
            report.problems.append(f"{name}: does not follow the checkpoint before it (one was removed)")
        previous = checkpoint
        if checkpoint.last_event_id <= report.pruned_through:
            continue
        already = len(report.problems)
        digest = _check_range(report, checkpoint.first_event_id, checkpoint.last_event_id)
        if (digest.count, digest.hexdigest()) != (checkpoint.event_count, checkpoint.digest) and len(
            report.problems
        ) == already:
            report.problems.append(
                f"{name}: {digest.count} rows now, {checkpoint.event_count} when sealed, or not the same ones: "
                "a row was deleted, inserted or renumbered"
            )
    tail = _check_range(report, (previous.last_event_id if previous else 0) + 1, None)
    report.rows_after_last_checkpoint = tail.count
    report.outcomes_unknown = AuditEvent.objects.filter(outcome=AuditEvent.Outcome.UNKNOWN).count()
    return report
