"""Pins of everything an upstream says besides its tools: resources, resource templates, prompts (with the text
of those that need no argument) and instructions. Stored and approved as tools are (registry/services.py): agents
get the approved copy (handoff/mcp/pinned.py), a changed one waits for an administrator.

The upstream's own instructions field holds the approved instructions: that is what the gateway's include."""

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit.services import audit_record, canonical_sha256
from policy.config_version import config_changed
from policy.models import team_slug_of
from registry.models import PinnedItem, Upstream

Kind = PinnedItem.Kind
# The catalog's lists: the kind they hold and the field that names each entry.
LISTED = {
    "resources": (Kind.RESOURCE, "uri"),
    "resourceTemplates": (Kind.RESOURCE_TEMPLATE, "uriTemplate"),
    "prompts": (Kind.PROMPT, "name"),
}
MAX_KEY_BYTES = 1024  # the unique index's limit, with room to spare


def approval(definition: dict[str, Any], sha256: str, actor: str) -> dict[str, Any]:
    """The fields of a pin (a tool's or an item's) that approve `definition`."""
    return {
        "approved_definition": definition,
        "approved_sha256": sha256,
        "approved_at": timezone.now(),
        "approved_by": actor,
    }


@dataclass
class Said:
    """What the listing says besides tools: kind -> {key: definition} for each list the upstream answered, and
    the entries refused ("<kind> <key>: why")."""

    items: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)


def _refusal(key: Any, seen: dict[str, Any]) -> str | None:
    if not isinstance(key, str) or not key:
        return "it has no name or URI"
    if len(key.encode()) > MAX_KEY_BYTES:
        return f"longer than {MAX_KEY_BYTES} bytes"
    return "listed twice" if key in seen else None


def _said(upstream: Upstream, listed: dict[str, Any]) -> Said:
    said = Said({Kind.INSTRUCTIONS: {"": {"instructions": listed.get("instructions") or ""}}})
    for field_name, (kind, name) in LISTED.items():
        entries = listed.get(field_name)
        # A per-person upstream's resources are each person's own, not the upstream's word: listed live.
        if entries is None or (kind == Kind.RESOURCE and upstream.per_person):
            continue
        said.items[kind] = {}
        for entry in entries:
            key = entry.get(name) if isinstance(entry, dict) else None
            if problem := _refusal(key, said.items[kind]):
                said.rejected.append(f"{Kind(kind).label} {str(key)[:128]!r}: {problem}")
            else:
                said.items[kind][key] = entry
    return said


def pinned_items_store(*, upstream: Upstream, listed: dict[str, Any], actor: str) -> tuple[list[str], list[str]]:
    """Store what the catalog listing says besides tools, inside the sync's transaction; what is held, as
    "<kind> <key>", and what was refused, with why. The first sync that pins items approves them (trust on first
    use, as for tools); afterwards a new item follows the upstream's `new_tools` setting and a changed one is held
    until approved."""
    existing = {(item.kind, item.key): item for item in upstream.pinned_items.all()}
    first = not existing
    now, held, said = timezone.now(), [], _said(upstream, listed)
    for kind, items in said.items.items():
        for key, definition in items.items():
            sha256 = canonical_sha256(definition)
            item = existing.get((kind, key))
            if item is None:
                approved = first or upstream.new_tools == Upstream.NewTools.APPROVE
                pin = approval(definition, sha256, actor) if approved else {}
                fields = {"definition": definition, "definition_sha256": sha256, "last_seen_at": now}
                item = PinnedItem.objects.create(upstream=upstream, kind=kind, key=key, **fields, **pin)
                action = "item_added"
            else:
                approved = item.approved_sha256 == sha256
                PinnedItem.objects.filter(pk=item.pk).update(
                    definition=definition, definition_sha256=sha256, last_seen_at=now
                )
                action = "item_changed" if item.definition_sha256 != sha256 else ""
            if not approved:
                held.append(f"{item.get_kind_display()} {key}".strip())
            elif kind == Kind.INSTRUCTIONS:
                Upstream.objects.filter(pk=upstream.pk).update(instructions=definition["instructions"])
            if action:
                _event(upstream, action, kind, key, sha256, actor, held=not approved)
        gone = [item for (k, key), item in existing.items() if k == kind and key not in items]
        for item in gone:
            _event(upstream, "item_removed", kind, item.key, item.definition_sha256, actor, held=False)
        PinnedItem.objects.filter(pk__in=[item.pk for item in gone]).delete()
    return held, said.rejected


def _event(upstream: Upstream, action: str, kind: str, key: str, sha256: str, actor: str, *, held: bool) -> None:
    detail = {"action": action, "item": kind, "key": key, "definition_sha256": sha256, "held_for_approval": held}
    audit_record(kind="admin_change", actor=actor, upstream=upstream.slug, team=team_slug_of(upstream), detail=detail)


def pinned_item_approve(*, item: PinnedItem, actor: str) -> None:
    """Pin the item's current definition: agents get it from now on (approved instructions become the ones the
    gateway's include)."""
    with transaction.atomic():
        previous = item.approved_sha256
        PinnedItem.objects.filter(pk=item.pk).update(**approval(item.definition, item.definition_sha256, actor))
        if item.kind == Kind.INSTRUCTIONS:
            Upstream.objects.filter(pk=item.upstream_id).update(instructions=item.definition["instructions"])
        config_changed()
        detail = {
            "action": "item_approved",
            "item": item.kind,
            "key": item.key,
            "definition_sha256": item.definition_sha256,
            "previous_sha256": previous,
        }
        upstream = item.upstream
        audit_record(
            kind="admin_change", actor=actor, upstream=upstream.slug, team=team_slug_of(upstream), detail=detail
        )
    item.approved_sha256 = item.definition_sha256
