from django.db import models


class ServerGroup(models.Model):
    class Isolation(models.TextChoices):
        STRICT = "strict", "Strict: a session that enters this group stays in it"
        OPEN = "open", "Open: reachable from any session"

    name = models.CharField(max_length=64, unique=True)
    isolation = models.CharField(max_length=8, choices=Isolation.choices, default=Isolation.OPEN)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Agent(models.Model):
    """A client of the gateway (an MCP host such as Claude Desktop or an automation)."""

    name = models.CharField(max_length=64, unique=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AgentKey(models.Model):
    """An API key: only its SHA-256 is stored. Keys are 256-bit random, so a fast hash is enough."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="keys")
    prefix = models.CharField(max_length=16, unique=True, help_text="Public part of the key, for lookup")
    digest = models.CharField(max_length=64)
    label = models.CharField(max_length=64, blank=True)
    revoked = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"sb_{self.prefix}_…"
