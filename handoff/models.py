import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from policy.models import team_field
from registry.models import Upstream, slug_validator


class HandoffRoute(models.Model):
    """A triage tool the gateway offers: `<gateway><sep>handoff_to_<domain>` hands the session to the target."""

    domain = models.CharField(
        max_length=32,
        unique=True,
        validators=[slug_validator],
        help_text="The specialist's domain (finance, devops, ...): the namespace of its tools during a handoff",
    )
    team = team_field("handoff_routes")
    description = models.TextField(help_text="When to hand off here: the model reads this to decide")
    target = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="handoff_routes")
    enabled = models.BooleanField(default=True)
    connect_timeout = models.FloatField(
        default=settings.GATEWAY_HANDOFF_CONNECT_TIMEOUT,
        validators=[MinValueValidator(0.1), MaxValueValidator(settings.GATEWAY_MAX_TIMEOUT)],
        help_text="Seconds the specialist has to accept the tunnel",
    )
    max_sessions = models.PositiveIntegerField(
        default=settings.GATEWAY_HANDOFF_MAX_SESSIONS, help_text="Tunnels open to this route at once"
    )
    idle_timeout = models.FloatField(
        default=settings.GATEWAY_HANDOFF_IDLE_SECONDS,
        validators=[MinValueValidator(1), MaxValueValidator(86_400)],
        help_text="Seconds unused before a tunnel is swept",
    )

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return f"{self.domain} → {self.target.slug}"

    def clean(self) -> None:
        if self.domain == settings.GATEWAY_NAME:
            raise ValidationError({"domain": f"{self.domain!r} is the gateway's own namespace (GATEWAY_NAME)."})


class Tunnel(models.Model):
    """One agent session handed to a specialist: its own upstream session, held by the worker that opened it."""

    class State(models.TextChoices):
        CONNECTING = "connecting"
        OPEN = "open"
        CLOSED = "closed"

    LIVE = (State.CONNECTING, State.OPEN)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey("policy.Agent", on_delete=models.CASCADE, related_name="tunnels")
    session_key = models.CharField(max_length=160, help_text="The agent's session (or, for stateless requests, key)")
    domain = models.CharField(max_length=32)
    route = models.ForeignKey(HandoffRoute, null=True, blank=True, on_delete=models.SET_NULL, related_name="tunnels")
    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="tunnels")
    worker_queue = models.CharField(max_length=200, blank=True, help_text="The worker holding the tunnel")
    state = models.CharField(max_length=12, choices=State.choices, default=State.CONNECTING)
    idle_timeout = models.FloatField()
    opened_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reason = models.CharField(max_length=48, blank=True)

    class Meta:
        ordering = ["-opened_at"]
        constraints = [
            # One live tunnel per agent session: a second activation loses the race instead of sharing.
            models.UniqueConstraint(
                fields=["agent", "session_key"],
                condition=models.Q(state__in=["connecting", "open"]),
                name="tunnel_one_live_per_session",
            )
        ]
        indexes = [models.Index(fields=["state", "last_used_at"])]

    def __str__(self) -> str:
        return f"{self.domain} tunnel of {self.session_key}"

    @property
    def token_id(self) -> str:
        """The delegation's `tid`: one token identity per tunnel."""
        return self.id.hex

    def is_idle(self, now) -> bool:
        """Live, and unused (or, connecting, unopened) for its idle timeout."""
        return self.state in self.LIVE and (now - self.last_used_at).total_seconds() >= self.idle_timeout


class ClaimCheck(models.Model):
    """Carry-over state waiting for its one redemption (the embedded default's claim-check store)."""

    id = models.CharField(primary_key=True, max_length=64)
    state = models.JSONField()
    expires_at = models.DateTimeField(db_index=True)


class ToolTask(models.Model):
    """A tools/call answered as a task because it waits for a sign-off (handoff/mcp/pipeline/tool_task.py), found by
    any web process. 2026-07-28's Tasks extension: the poll that finds the request decided runs the call. 2025-11-25's
    tasks: the process that took the call runs it and writes here where it stands, for the session's other processes.
    Only its caller finds it; its arguments are kept until the call runs, its outcome until the task expires."""

    class Status(models.TextChoices):
        WORKING = "working"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    id = models.CharField(primary_key=True, max_length=32)
    sign_off = models.ForeignKey("policy.SignOff", on_delete=models.CASCADE, related_name="tasks")
    # Whose: the caller as the sign-off binds them.
    agent_id = models.BigIntegerField()
    key_prefix = models.CharField(max_length=16, blank=True)
    person_issuer = models.CharField(max_length=255, blank=True)
    person_subject = models.CharField(max_length=255, blank=True)
    client_id = models.CharField(max_length=255, blank=True)
    session_id = models.CharField(max_length=64, blank=True, help_text="A 2025-11-25 task's session")
    name = models.CharField(max_length=256, help_text="The tool as the agent called it")
    arguments = models.JSONField(null=True, blank=True)
    status = models.CharField(max_length=9, choices=Status.choices, default=Status.WORKING)
    message = models.CharField(max_length=1000, blank=True)
    outcome = models.JSONField(null=True, blank=True, help_text="The call's result, or its JSON-RPC error")
    running_until = models.DateTimeField(null=True, blank=True, help_text="A process runs the call until then")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(db_index=True)
