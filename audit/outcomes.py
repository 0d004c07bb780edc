"""Outcomes nobody wrote. A call approved by a process that then died, or whose completion the database
refused, has no completion row. Once its deadline and a grace period have passed, the sweep writes one for
it whose outcome is unknown. A call has at most one completion row (the `audit_one_outcome` constraint),
so a late completion and the sweep never both land: whichever is inserted first stands."""

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from audit.models import AuditEvent, team_of
from audit.services import audit_record

DEADLINE = "deadline_seconds"  # on an approval's detail: how long after it the call may still end
# How long past the upstream's own timeout a caller waits for the executor before calling it lost.
EXECUTOR_GRACE_SECONDS = 5.0
OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
BATCH = 500
# The call's own fields, carried over from its approval.
CARRIED = (
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
    "server",
)


def call_deadline(timeout: float) -> float:
    """How long a caller waits for a call on an upstream whose timeout is `timeout`: connecting, the call,
    then the grace (registry/executor.py waits this long). Past it the call has an outcome, or its process
    is gone and the sweep writes one."""
    return timeout + settings.GATEWAY_CONNECT_TIMEOUT + EXECUTOR_GRACE_SECONDS


class _Swept:
    """Approvals up to `through` had their outcome when this process last looked: later sweeps start there.
    Only a saving (the constraint keeps the trail right); a new process starts at the lookback."""

    through = 0


def _deadline(approval: dict[str, Any]) -> float:
    """Its seconds from the approval; an approval written before deadlines were kept gets the longest any
    call may take."""
    return float(approval["detail"].get(DEADLINE) or call_deadline(settings.GATEWAY_MAX_TIMEOUT))


def _approvals(after: int, now: datetime) -> list[dict[str, Any]]:
    since = now - timedelta(hours=settings.GATEWAY_AUDIT_OUTCOME_LOOKBACK_HOURS)
    completion = AuditEvent.objects.filter(kind=AuditEvent.Kind.COMPLETED, request_id=OuterRef("request_id"))
    rows = AuditEvent.objects.filter(kind=AuditEvent.Kind.APPROVED, id__gt=after, created_at__gte=since)
    rows = rows.annotate(settled=Exists(completion)).order_by("id")
    return list(rows.values("id", "created_at", "detail", "settled", "team", "seal", *CARRIED)[:BATCH])


def _settle(approval: dict[str, Any]) -> bool:
    """Write the approval's outcome-unknown completion; False if its own completion came first."""
    seconds = _deadline(approval)
    deadline = approval["created_at"] + timedelta(seconds=seconds)
    why = (
        f"No completion was recorded by the call's deadline ({deadline.isoformat(timespec='seconds')}, "
        f"{seconds:g} s after its approval): the process running it stopped or lost the database, so whether "
        "the call took effect is unknown."
    )
    kept = {k: v for k, v in approval["detail"].items() if k not in ("arguments", DEADLINE)}
    detail = kept | {"approval_event": approval["id"], DEADLINE: seconds}
    # The call's team, as its approval reads: an approval sealed before teams came is the default team's.
    fields = {name: approval[name] for name in CARRIED}
    fields["team"] = team_of(team=approval["team"], seal=approval["seal"])
    try:
        with transaction.atomic():
            audit_record(
                kind=AuditEvent.Kind.COMPLETED,
                outcome=AuditEvent.Outcome.UNKNOWN,
                error_code=OUTCOME_UNKNOWN,
                error_detail=why,
                detail=detail,
                **fields,
            )
    except IntegrityError:
        return False
    return True


def outcomes_settle(*, now: datetime | None = None) -> int:
    """Give every approval of the lookback that is past its deadline and the grace period, and has no
    completion, an outcome-unknown one; the number written. Each query reads at most BATCH approvals."""
    now = now or timezone.now()
    grace = timedelta(seconds=settings.GATEWAY_AUDIT_OUTCOME_GRACE_SECONDS)
    # A row this recent may yet be joined by one with a lower id (its insert was slower): no mark past it.
    settling = now - timedelta(seconds=settings.GATEWAY_AUDIT_CHECKPOINT_SETTLE_SECONDS)
    written, after, waiting = 0, _Swept.through, False
    while rows := _approvals(after, now):
        for approval in rows:
            if not approval["settled"]:
                if approval["created_at"] + timedelta(seconds=_deadline(approval)) + grace > now:
                    waiting = True  # may still end on its own: the next sweep looks again
                else:
                    written += _settle(approval)
            waiting = waiting or approval["created_at"] >= settling
            after = approval["id"]
            if not waiting:
                _Swept.through = after
        if len(rows) < BATCH:
            break
    return written
