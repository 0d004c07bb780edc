"""The one writer of the audit trail: `audit_record` from sync code; audit/writer.py for async code."""

import hashlib
import json
from typing import Any

from django.utils import timezone

from audit.integrity import row_seal
from audit.models import AuditEvent

# Each column's value when a writer leaves it out: what the row holds, and so what its MAC covers.
_DEFAULTS = {
    f.attname: f.get_default() for f in AuditEvent._meta.concrete_fields if not f.primary_key and f.attname != "mac"
}


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


def audit_fields(kind: str, detail: dict[str, Any] | None, fields: dict[str, Any]) -> dict[str, Any]:
    """Every column of the event, each string made storable, the row timed and sealed."""
    clean = {k: text_safe(v) if isinstance(v, str) else v for k, v in fields.items()}
    row = _DEFAULTS | clean | {"kind": kind, "detail": json_safe(detail or {}), "created_at": timezone.now()}
    return row | {"mac": row_seal(row)}


def audit_event(*, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> AuditEvent:
    """An unsaved event with every string made storable."""
    return AuditEvent(**audit_fields(kind, detail, fields))


def audit_record(*, kind: str, detail: dict[str, Any] | None = None, **fields: Any) -> AuditEvent:
    event = audit_event(kind=kind, detail=detail, **fields)
    event.save()
    return event


def audit_record_per_team(
    *, kind: str, details: dict[str, dict[str, Any]], gateway_wide: dict[str, Any], **fields: Any
) -> None:
    """A change that concerns several teams at once (credentials resealed, an export): one row for each team, with
    `details[team]`, so that each team's auditors read theirs; one row of no team (`gateway_wide`, a gateway
    admin's) when it concerns none."""
    for team, detail in sorted(details.items()):
        audit_record(kind=kind, team=team, detail=detail, **fields)
    if not details:
        audit_record(kind=kind, detail=gateway_wide, **fields)
