"""The configuration version: one counter that goes up in the same transaction as any change to what routing
reads (upstreams, tools, groups, agents, keys), so every web process knows when its snapshot is stale."""

from typing import Any

from django.db.models import F

from policy.models import ConfigVersion


def config_changed() -> None:
    """Call inside the transaction that changes routing data: readers see both together."""
    if not ConfigVersion.objects.filter(pk=1).update(version=F("version") + 1):
        ConfigVersion.objects.get_or_create(pk=1, defaults={"version": 1})


def on_routing_row_changed(**kwargs: Any) -> None:
    """Receiver for post_save, post_delete and m2m_changed of the models routing reads (apps.py)."""
    if kwargs.get("action", "post_").startswith("post_"):
        config_changed()


def config_version() -> int:
    return ConfigVersion.objects.filter(pk=1).values_list("version", flat=True).first() or 0
