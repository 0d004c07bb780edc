"""Which sessions' tools list a change altered, on snapshots compiled from the database: by the few names whose
tool changed when only tools did, by each whole list when anything else did (a rule); a virtual server's sessions
hear only of the tools it offers."""

import anyio

from handoff.mcp.session_views import SessionView, session_views_changed
from handoff.snapshot import snapshot_compile
from policy.decisions import who_of
from policy.models import Rule
from policy.services import rule_save
from registry.models import Tool, Upstream
from tests.factories import agent


def _views(snap, **agents) -> dict[str, SessionView]:
    return {name: SessionView(who_of(agent_id), (), None, snap) for name, agent_id in agents.items()}


def test_a_rule_denying_one_agent_a_tool_wakes_that_agents_sessions_only(db, caller):
    with agent("views-denied") as (denied, _), agent("views-other") as (other, _):
        before = snapshot_compile()
        views = _views(before, denied=denied.id, other=other.id)
        layer = Upstream.objects.get(slug="layer")
        rule = Rule(effect=Rule.Effect.DENY, agent=denied, upstream=layer, tool_pattern="echo")
        rule_save(rule=rule, actor="test", created=True)
        after = snapshot_compile()
        woken = anyio.run(lambda: session_views_changed(views=views, snap=after))
        rule.delete()

    assert woken == ["denied"]
    assert all(view.seen is after for view in views.values())  # the next change is compared with this one


def test_a_tool_changed_at_its_upstream_wakes_the_sessions_listing_it(db, caller):
    with agent("views-limited") as (limited, _):
        before = snapshot_compile()
        views = _views(before, whole=limited.id)
        views["add-only"] = SessionView(who_of(limited.id), ("layer__add",), None, before)
        # A virtual server's session (/mcp/s/<name>) that offers only add, and one that offers echo.
        views["server-add"] = SessionView(who_of(limited.id), (), ("layer__add",), before)
        views["server-echo"] = SessionView(who_of(limited.id), (), ("layer__e*",), before)
        echo = Tool.objects.get(name="echo", upstream__slug="layer")
        Tool.objects.filter(pk=echo.pk).update(
            definition=echo.definition | {"description": "Changed."},
            approved_definition=echo.definition | {"description": "Changed."},
        )
        after = snapshot_compile()
        woken = anyio.run(lambda: session_views_changed(views=views, snap=after))
        Tool.objects.filter(pk=echo.pk).update(definition=echo.definition, approved_definition=echo.approved_definition)

    assert woken == ["whole", "server-echo"]
