from django.db import models
from django.db.models import Q
from django.utils import timezone

DEFAULT_TEAM = "default"  # the slug of the team that held everything when teams came (policy.models.Team)
SEAL_TEAMS = 3  # the seal version of rows that carry their team (audit/integrity.py)
SEAL_SERVERS = 4  # ... and the virtual server a call came through


class AuditEvent(models.Model):
    """One append-only row of the audit trail, sealed with an HMAC (audit/integrity.py). Written only through
    audit.services.audit_record and audit.writer; on PostgreSQL a trigger refuses UPDATE and DELETE."""

    class Kind(models.TextChoices):
        APPROVED = "approved"
        DENIED = "denied"
        COMPLETED = "completed"
        ADMIN_CHANGE = "admin_change"
        HANDOFF = "handoff"
        SESSION = "session"
        SIGN_IN = "sign_in"  # a console sign-in locked after repeated failures
        # A person's sign-off on one call (policy.models.SignOff): asked for, then granted, refused or expired.
        SIGNOFF_ASKED = "signoff_asked"
        SIGNOFF_GRANTED = "signoff_granted"
        SIGNOFF_REFUSED = "signoff_refused"
        SIGNOFF_EXPIRED = "signoff_expired"

    class Outcome(models.TextChoices):
        OK = "ok"
        ERROR = "error"
        TIMEOUT = "timeout"
        DENIED = "denied"
        UNKNOWN = "unknown", "Outcome unknown"  # the call's deadline passed with no completion (audit/outcomes.py)

    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=24, choices=Kind.choices)
    request_id = models.UUIDField(null=True, blank=True, db_index=True)
    agent_id = models.BigIntegerField(null=True, blank=True)
    agent_name = models.CharField(max_length=64, blank=True)
    # The team of the agent that called, by value (its slug then); "" for a row of no team's (a refused token,
    # a sign-in). Rows sealed before teams came have no team column of their own: they read as DEFAULT_TEAM.
    team = models.CharField(max_length=32, blank=True)
    # The virtual server (/mcp/s/<name>) the call came through, by name; "" for /mcp and what no call made.
    server = models.CharField(max_length=64, blank=True)
    # The person a bearer token named (issuer and subject, and their name then), and the OAuth client acting
    # for them: values, not foreign keys, so the trail outlives the accounts and stays the bottom layer.
    person_issuer = models.CharField(max_length=255, blank=True)
    person_subject = models.CharField(max_length=255, blank=True)
    person_name = models.CharField(max_length=150, blank=True)
    client_id = models.CharField(max_length=255, blank=True)
    session_id = models.CharField(max_length=128, blank=True)
    transport = models.CharField(max_length=16, blank=True)
    upstream = models.CharField(max_length=32, blank=True)
    tool = models.CharField(max_length=256, blank=True)
    exposed_name = models.CharField(max_length=256, blank=True)
    arguments_sha256 = models.CharField(max_length=64, blank=True)
    outcome = models.CharField(max_length=8, choices=Outcome.choices, blank=True)
    error_code = models.CharField(max_length=48, blank=True)
    error_detail = models.TextField(blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    response_bytes = models.PositiveIntegerField(null=True, blank=True)
    actor = models.CharField(max_length=150, blank=True, help_text="Admin user for admin changes")
    detail = models.JSONField(default=dict, blank=True)
    trace_id = models.CharField(max_length=32, blank=True, help_text="W3C trace id of the request's span")
    mac = models.CharField(max_length=80, default="", editable=False, help_text="kid:HMAC-SHA256 over the row")
    # Which fields `mac` covers (audit/integrity.py): 0 for rows written before version 3, whose version their
    # content tells; every new row is sealed at SEAL_SERVERS.
    seal = models.PositiveSmallIntegerField(default=SEAL_SERVERS, editable=False)

    class Meta:
        ordering = ["-id"]
        # Each index serves one filter of the audit browser, newest first; rare values get partial indexes.
        indexes = [
            models.Index(fields=["agent_name", "-id"]),
            models.Index(fields=["upstream", "-id"]),
            models.Index(fields=["tool", "-id"]),
            models.Index(fields=["error_code", "-id"], condition=~Q(error_code=""), name="audit_error_code_idx"),
            models.Index(fields=["outcome", "-id"], condition=~Q(outcome__in=["", "ok"]), name="audit_failure_idx"),
            models.Index(fields=["trace_id"], condition=~Q(trace_id=""), name="audit_trace_idx"),
            models.Index(fields=["person_subject", "-id"], condition=~Q(person_subject=""), name="audit_person_idx"),
            # A team's auditor reads the trail newest first through audit_of_teams (team = x, seal >= SEAL_TEAMS).
            models.Index(fields=["team", "-id"], name="audit_team_idx"),
        ]
        # One outcome per call: a late completion and the sweep's outcome-unknown row race, the first wins.
        constraints = [
            models.UniqueConstraint(fields=["request_id"], condition=Q(kind="completed"), name="audit_one_outcome"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.upstream}/{self.tool} {self.request_id}"

    @property
    def team_slug(self) -> str:
        """The row's team: its own, or for a row sealed before teams came, the default team."""
        return team_of(team=self.team, seal=self.seal)


def team_of(*, team: str, seal: int) -> str:
    return team if seal >= SEAL_TEAMS else DEFAULT_TEAM


class AuditCheckpoint(models.Model):
    """A signed summary of a contiguous range of audit rows, chained to the checkpoint before it: a row
    deleted, inserted or reordered inside a checkpointed range no longer matches `digest`."""

    created_at = models.DateTimeField(default=timezone.now)
    first_event_id = models.BigIntegerField(unique=True)  # one writer per range: a racing second one fails
    last_event_id = models.BigIntegerField()
    events_before = models.DateTimeField(help_text="Every row of the range was written before this")
    event_count = models.PositiveIntegerField()
    digest = models.CharField(max_length=64, help_text="SHA-256 over the range's rows, in id order")
    previous_mac = models.CharField(max_length=80, blank=True)
    mac = models.CharField(max_length=80)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"checkpoint {self.pk}: events {self.first_event_id}..{self.last_event_id}"
