from django.db import models


class AuditEvent(models.Model):
    """One append-only row of the audit trail. Written only through audit.services.audit_record."""

    class Kind(models.TextChoices):
        APPROVED = "approved"
        DENIED = "denied"
        COMPLETED = "completed"
        ADMIN_CHANGE = "admin_change"
        HANDOFF = "handoff"

    class Outcome(models.TextChoices):
        OK = "ok"
        ERROR = "error"
        TIMEOUT = "timeout"
        DENIED = "denied"

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=24, choices=Kind.choices)
    request_id = models.UUIDField(null=True, blank=True, db_index=True)
    agent_id = models.BigIntegerField(null=True, blank=True)
    agent_name = models.CharField(max_length=64, blank=True)
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

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["agent_name", "-id"]), models.Index(fields=["upstream", "-id"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.upstream}/{self.tool} {self.request_id}"
