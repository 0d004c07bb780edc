"""What each session held in this process sees, so that a change wakes only the sessions whose list it changed.

A session's view is its caller's standing (the agent, the person and their groups, an API key's tool patterns)
and the snapshot it last listed its tools from (or was last compared on). When the catalog changes, each view's
list is compared on that snapshot and the new one: when only tools changed (an upstream's change), by the few
names whose tool differs; else by a digest of each whole list. Both are kept in the snapshots' memos per standing,
so a thousand sessions of one agent cost one comparison, not a thousand. A virtual server's session has its
server's tool patterns in its view, so it hears only of changes to the tools that server offers.
"""

import asyncio
import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from handoff.mcp.caller import Caller, allows
from handoff.snapshot import Snapshot
from policy.decisions import Who

LISTS = "session_views.lists"  # the snapshot memo's key: a view's standing -> the tools list its caller gets
MAX_STANDINGS = 4096  # lists kept per snapshot; past it they are made again (standings: agents x keys x servers)
DIGESTS = "session_views.tools"  # the snapshot memo's key: a view's standing -> digest of that tools list
DEFINITIONS = "session_views.definitions"  # id of a definition in the snapshot -> its digest
CHANGED_NAMES = "session_views.changed"  # id of an older snapshot -> the names whose tool differs, or None


@dataclass(frozen=True, slots=True)
class SessionView:
    who: Who
    key_tools: tuple[str, ...]  # an API key's tool patterns (Caller.key_tools): what it may call at all
    offered: tuple[str, ...] | None  # its virtual server's tool patterns (Caller.offered); None for /mcp
    seen: Snapshot  # the snapshot this session's lists were last compared on

    @property
    def standing(self) -> tuple:
        """What its tools list rests on besides the snapshot: sessions of one standing share their comparisons."""
        return (self.who, self.key_tools, self.offered)

    def may_call(self, snap: Snapshot, name: str) -> bool:
        """By the name /mcp lists the tool under (what a virtual server's offers and a key's patterns match)."""
        return allows(self.key_tools, self.offered, snap.listed_name(self.who, name))


def session_view_of(*, caller: Caller, snap: Snapshot) -> SessionView:
    return SessionView(caller.who, caller.key_tools, caller.offered, snap)


def tools_listed(*, snap: Snapshot, view: SessionView) -> tuple[dict[str, Any], ...]:
    """The tools list this view's caller gets from `snap` (tools/list pages it), made once per standing: a virtual
    server's patterns are matched against a large catalog once, not on every request."""
    lists: dict[tuple, tuple[dict[str, Any], ...]] = snap.memo.setdefault(LISTS, {})
    if (listed := lists.get(view.standing)) is None:
        if len(lists) >= MAX_STANDINGS:
            lists.clear()
        listed = lists[view.standing] = tuple(t for t in snap.visible_for(view.who) if view.may_call(snap, t["name"]))
    return listed


def tools_digest(*, snap: Snapshot, view: SessionView) -> str:
    """The SHA-256 of the tools list this view's caller gets from `snap` (as tools/list builds it)."""
    digests: dict[tuple, str] = snap.memo.setdefault(DIGESTS, {})
    standing = view.standing
    if standing not in digests:
        listed = hashlib.sha256()
        for tool in tools_listed(snap=snap, view=view):
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


def _frame(snap: Snapshot) -> tuple:
    """What a tools list rests on besides the upstreams' tools: the rules, the agents and their teams, the names
    teams see renamed, the teams groups are mapped to, the gateway's own tools, the virtual servers' overrides."""
    agents, overrides = frozenset(snap.agents), {name: server.overrides for name, server in snap.servers.items()}
    return (
        snap.policy,
        agents,
        snap.agent_teams,
        snap.renamed,
        snap.mapped_teams,
        snap.builtins,
        snap.triage,
        overrides,
    )


def _changed_names(old: Snapshot, new: Snapshot) -> frozenset[str] | None:
    """The exposed names (a team's local ones included) whose tool differs between the snapshots, when nothing else
    a tools list rests on does; None when something else does, and every list is compared whole."""
    known: dict[int, frozenset[str] | None] = new.memo.setdefault(CHANGED_NAMES, {})
    if id(old) not in known:
        names: set[str] | None = None
        if _frame(old) == _frame(new):
            teams = old.local.keys() | new.local.keys()
            pairs = [(old.tools, new.tools)] + [(old.local.get(t, {}), new.local.get(t, {})) for t in teams]
            names = {name for was, now in pairs for name in was.keys() | now.keys() if was.get(name) != now.get(name)}
        known[id(old)] = frozenset(names) if names is not None else None  # `old` outlives this: a view holds it
    return known[id(old)]


def _seen(snap: Snapshot, view: SessionView, name: str) -> dict[str, Any] | None:
    """The definition the view's caller is listed under this name, if it is listed at all."""
    entry = snap.tool(view.who, name)
    if entry is None or not view.may_call(snap, name) or snap.decide(view.who, name)[0] is not None:
        return None
    return entry.definition


def _overrides(snap: Snapshot, view: SessionView) -> bool:
    server = snap.servers.get(view.who.server)
    return server is not None and bool(server.overrides)


def _list_changed(old: Snapshot, new: Snapshot, view: SessionView) -> bool:
    """Whether the view's tools list differs between the snapshots: by the few names whose tool changed when only
    tools did (what an upstream's change is), else by the digests of the whole lists."""
    names = _changed_names(old, new)
    if names is None or _overrides(old, view) or _overrides(new, view):  # names the server's own overrides change
        return tools_digest(snap=old, view=view) != tools_digest(snap=new, view=view)
    if settings.GATEWAY_CODE_MODE == "only":  # code mode's own tools stand in for every upstream's
        return False
    return any(_seen(old, view, name) != _seen(new, view, name) for name in names)


async def session_views_changed(*, views: dict[str, SessionView], snap: Snapshot) -> list[str]:
    """The sessions whose tools list differs between the snapshot each last saw and `snap`; every view is moved on
    to `snap` (in place), so the next change is compared with this one. A standing's lists cost what a tools/list
    costs (the new one is kept for the woken sessions' own): the loop is let go after each, so requests go on."""
    changed, compared = [], set()
    for session, view in list(views.items()):
        if view.seen is not snap and _list_changed(view.seen, snap, view):
            changed.append(session)
        if views.get(session) is view:  # not forgotten, nor seen anew, while the loop was let go
            views[session] = replace(view, seen=snap)
        if (standing := view.standing) not in compared:
            compared.add(standing)
            await asyncio.sleep(0)
    return changed


def session_views_reaching(*, views: dict[str, SessionView], snap: Snapshot, upstream_id: int) -> set[str]:
    """The sessions whose lists of resources and prompts can hold the upstream's (the gateway relays those live,
    so the upstream's word that they changed is all there is): their team may reach it, and it serves agents
    directly (a specialist's are reached through a handoff)."""
    target = next((t for t in snap.targets.values() if t.id == upstream_id), None)
    if target is None or target.handoff_only:
        return set()
    return {session for session, view in views.items() if snap.reachable(view.who, target.slug)}
