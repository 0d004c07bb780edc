"""Everything that writes upstreams and their catalog."""

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record, canonical_sha256
from handoff.snapshot import config_changed
from registry.executor import get_executor
from registry.models import Tool, Upstream
from registry.naming import TOOL_NAME

logger = logging.getLogger(__name__)


@dataclass
class SyncReport:
    upstream: str
    ok: bool
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    error: str = ""

    def summary(self) -> str:
        if not self.ok:
            return f"{self.upstream}: catalog sync failed: {self.error}"
        return (
            f"{self.upstream}: {len(self.added)} added, {len(self.changed)} changed, "
            f"{len(self.removed)} removed, {len(self.rejected)} rejected"
        )


def _tool_fields(definition: dict[str, Any]) -> dict[str, Any]:
    return {
        "title": definition.get("title") or "",
        "description": definition.get("description") or "",
        "input_schema": definition.get("inputSchema") or {},
        "output_schema": definition.get("outputSchema"),
        "annotations": definition.get("annotations"),
        "definition": definition,
        "definition_sha256": canonical_sha256(definition),
    }


def upstream_catalog_sync(*, upstream: Upstream) -> SyncReport:
    """Fetch every page of the upstream's tools through the executor and store them."""
    report = SyncReport(upstream=upstream.slug, ok=False)
    outcome = get_executor().list_tools(upstream_id=upstream.id, revision=upstream.revision, timeout=upstream.timeout)
    if not outcome["ok"]:
        report.error = f"{outcome['code']}: {outcome['message']}"
        logger.warning("catalog sync of %s failed: %s", upstream.slug, outcome.get("detail"))
        Upstream.objects.filter(pk=upstream.pk).update(last_sync_error=report.error)
        return report
    _catalog_store(upstream, outcome["result"], report)
    report.ok = True
    return report


@transaction.atomic
def _catalog_store(upstream: Upstream, definitions: list[dict[str, Any]], report: SyncReport) -> None:
    now = timezone.now()
    existing = {tool.name: tool for tool in upstream.tools.all()}
    seen = set()
    for definition in definitions:
        name = definition.get("name", "")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name) or name in seen:
            report.rejected.append(str(name)[:128])
            continue
        seen.add(name)
        fields = _tool_fields(definition)
        tool = existing.get(name)
        if tool is None:
            Tool.objects.create(upstream=upstream, name=name, last_seen_at=now, **fields)
            report.added.append(name)
            continue
        if tool.definition_sha256 != fields["definition_sha256"]:
            report.changed.append(name)
        Tool.objects.filter(pk=tool.pk).update(last_seen_at=now, **fields)
    report.removed = sorted(set(existing) - seen)
    upstream.tools.filter(name__in=report.removed).delete()
    Upstream.objects.filter(pk=upstream.pk).update(last_synced_at=now, last_sync_error="")
    config_changed()


def upstream_set_enabled(*, upstream: Upstream, enabled: bool, actor: str = "") -> None:
    with transaction.atomic():
        Upstream.objects.filter(pk=upstream.pk).update(enabled=enabled, updated_at=timezone.now())
        config_changed()
        audit_record(
            kind="admin_change",
            actor=actor,
            upstream=upstream.slug,
            detail={"action": "upstream_enabled" if enabled else "upstream_disabled"},
        )
    upstream.enabled = enabled


def upstream_save(*, upstream: Upstream, actor: str = "", created: bool = False) -> None:
    """Save an upstream; a change in how to reach it bumps its revision so executors reconnect."""
    with transaction.atomic():
        if not created:
            before = Upstream.objects.filter(pk=upstream.pk).values(*Upstream.CONNECTION_FIELDS).first()
            if before and any(before[f] != getattr(upstream, f) for f in Upstream.CONNECTION_FIELDS):
                upstream.revision += 1
        upstream.save()
        # Only field names: env values and headers may hold credentials.
        audit_record(
            kind="admin_change",
            actor=actor,
            upstream=upstream.slug,
            detail={
                "action": "upstream_created" if created else "upstream_saved",
                "transport": upstream.transport,
                "revision": upstream.revision,
                "env_keys": sorted(upstream.env),
                "header_keys": sorted(upstream.headers),
            },
        )
