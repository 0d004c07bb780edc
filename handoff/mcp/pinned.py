"""What agents are given of an upstream's resources, resource templates and prompts: the approved copy of each
pin (registry/pinned_items.py), read once per configuration version. An entry the upstream lists that was never
approved is left out; one that changed since its approval is given as approved. (Instructions need nothing here:
the upstream's own field holds the approved ones, and the snapshot reads that.)

An upstream not synced since pins began has none yet, and is listed live until its next sync pins it. A per-person
upstream's resources are each person's own: listed live."""

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from django.db import Error as DatabaseError

from gateway_project.lib.database import database_async
from handoff.snapshot import UpstreamInfo
from registry.models import PinnedItem

logger = logging.getLogger(__name__)

Kind = PinnedItem.Kind
KIND_OF_LIST = {
    "resources/list": Kind.RESOURCE,
    "resources/templates/list": Kind.RESOURCE_TEMPLATE,
    "prompts/list": Kind.PROMPT,
}
TEXT = "text"  # a prompt pin's prompts/get answer, kept beside its list entry


@dataclass(frozen=True)
class Copies:
    version: int
    approved: dict[tuple[int, str, str], dict[str, Any] | None]  # (upstream id, kind, key) -> None: never approved
    pinned: frozenset[int]  # upstreams that have pins

    def _pins(self, target: UpstreamInfo, kind: str) -> bool:
        return target.id in self.pinned and not (kind == Kind.RESOURCE and target.per_person)

    def entry(self, target: UpstreamInfo, kind: str, key: str, live: dict[str, Any]) -> dict[str, Any] | None:
        """What an agent is listed for the upstream's entry `live`, or None if it is held."""
        if not self._pins(target, kind):
            return live
        approved = self.approved.get((target.id, kind, key))
        return {k: v for k, v in approved.items() if k != TEXT} if approved is not None else None

    def prompt_known(self, target: UpstreamInfo, name: str) -> bool:
        """Whether the prompt may be got: an approved one (or one of an upstream with no pins yet)."""
        return not self._pins(target, Kind.PROMPT) or self.approved.get((target.id, Kind.PROMPT, name)) is not None

    def prompt_text(self, target: UpstreamInfo, name: str) -> dict[str, Any] | None:
        """The approved answer of prompts/get without arguments, when one was pinned."""
        approved = self.approved.get((target.id, Kind.PROMPT, name)) if self._pins(target, Kind.PROMPT) else None
        return (approved or {}).get(TEXT)


def _load(version: int) -> Copies:
    rows = PinnedItem.objects.values_list("upstream_id", "kind", "key", "approved_definition", "approved_sha256")
    approved, pinned = {}, set()
    for upstream_id, kind, key, definition, sha256 in rows:
        pinned.add(upstream_id)
        if kind != Kind.INSTRUCTIONS:
            approved[(upstream_id, kind, key)] = definition if sha256 else None
    return Copies(version, approved, frozenset(pinned))


class CopiesHolder:
    def __init__(self) -> None:
        self._copies: Copies | None = None
        self._lock: asyncio.Lock | None = None

    async def at(self, version: int) -> Copies:
        """The approved copies as of the configuration `version` (the snapshot's)."""
        if self._copies and self._copies.version == version:
            return self._copies
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if not self._copies or self._copies.version != version:
                try:
                    self._copies = await database_async(_load)(version)
                except DatabaseError as exc:
                    if self._copies is None:
                        raise
                    logger.warning("pins unreadable (%s): serving version %s meanwhile", exc, self._copies.version)
        return self._copies


copies = CopiesHolder()
