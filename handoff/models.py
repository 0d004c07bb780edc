from django.db import models


class ConfigVersion(models.Model):
    """One row whose counter goes up in the same transaction as any change to upstreams, tools, groups,
    agents or keys. Every web process compares it with its routing snapshot's (handoff/snapshot.py)."""

    version = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"configuration version {self.version}"
