"""What each session held in this process sees, so that a change wakes only the sessions whose list it changed.

A session's view is its caller's standing (the agent, the person and their groups, an API key's tool patterns)
and the snapshot its lists were last compared on. When the catalog changes, each view's tools list is digested
on the old snapshot and on the new one: a session is told only when the two differ. Digests are kept in each
snapshot's memo per standing, so a thousand sessions of one agent cost one digest per snapshot, not a thousand.
A virtual server's session will add its server to the view, and `tools_digest` filter by it.
"""

import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from handoff.mcp.caller import Caller, key_allows
from handoff.snapshot import Snapshot
from policy.decisions import Who

DIGESTS = "session_views.tools"  # the snapshot memo's key: (who, key patterns) -> digest of that tools list
DEFINITIONS = "session_views.definitions"  # id of a definition in the snapshot -> its digest


@dataclass(frozen=True, slots=True)
class SessionView:
    who: Who
    key_tools: tuple[str, ...]  # an API key's tool patterns (Caller.key_tools): what it may call at all
    seen: Snapshot  # the snapshot this session's lists were last compared on

    def may_call(self, name: str) -> bool:
        return key_allows(self.key_tools, name)


def session_view_of(*, caller: Caller, snap: Snapshot) -> SessionView:
    return SessionView(caller.who, caller.key_tools, snap)


def tools_digest(*, snap: Snapshot, view: SessionView) -> str:
    """The SHA-256 of the tools list this view's caller gets from `snap` (as tools/list builds it)."""
    digests: dict[tuple[Who, tuple[str, ...]], str] = snap.memo.setdefault(DIGESTS, {})
    standing = (view.who, view.key_tools)
    if standing not in digests:
        listed = hashlib.sha256()
        for tool in snap.visible_for(view.who):
            if view.may_call(tool["name"]):
                listed.update(_definition_digest(snap, tool))
        digests[standing] = listed.hexdigest()
    return digests[standing]


def _definition_digest(snap: Snapshot, definition: dict[str, Any]) -> bytes:
    """One definition's SHA-256, once per snapshot: every caller's list holds the same definition objects, which
    the snapshot keeps alive, so their ids are theirs for its lifetime."""
    known: dict[int, bytes] = snap.memo.setdefault(DEFINITIONS, {})
    if (digest := known.get(id(definition))) is None:
        digest = known[id(definition)] = hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).digest()
    return digest


def session_views_changed(*, views: dict[str, SessionView], snap: Snapshot) -> list[str]:
    """The sessions whose tools list differs between the snapshot each last saw and `snap`; every view is moved on
    to `snap` (in place), so the next change is compared with this one."""
    changed = []
    for session, view in list(views.items()):
        if view.seen is not snap and tools_digest(snap=view.seen, view=view) != tools_digest(snap=snap, view=view):
            changed.append(session)
        views[session] = replace(view, seen=snap)
    return changed


def session_views_reaching(*, views: dict[str, SessionView], snap: Snapshot, upstream_id: int) -> set[str]:
    """The sessions whose lists of resources and prompts can hold the upstream's (the gateway relays those live,
    so the upstream's word that they changed is all there is): their team may reach it, and it serves agents
    directly (a specialist's are reached through a handoff)."""
    target = next((t for t in snap.targets.values() if t.id == upstream_id), None)
    if target is None or target.handoff_only:
        return set()
    return {session for session, view in views.items() if snap.reachable(view.who, target.slug)}
