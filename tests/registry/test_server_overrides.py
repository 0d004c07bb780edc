"""Overrides per virtual server (issue 38): stacked on the upstream's override, for that server's sessions only;
every override the service refuses, with its exact error; the snapshot's view of the server and of /mcp."""

from collections.abc import Iterator

import pytest
from django.core.exceptions import ValidationError

from audit.models import AuditEvent
from handoff.snapshot import snapshot_compile
from policy.decisions import Who
from policy.models import Team
from policy.services import agent_create
from registry.models import ServerToolOverride, Tool, VirtualServer
from registry.overrides import override_check, override_parse, override_stack
from registry.server_overrides import server_override_clear, server_override_set, server_overrides_json
from registry.services import tool_override_set
from tests.helpers import audit_mark
from tests.registry.test_overrides import CURATED, WEATHER, weather  # noqa: F401 (a fixture)

DESK = {
    "name": "outlook",
    "description": "The outlook.",
    "params": {"place": {"name": "town"}},
}


@pytest.fixture
def desk(weather) -> Iterator[VirtualServer]:  # noqa: F811
    tool_override_set(tool=weather, data=CURATED, actor="olga")
    server = VirtualServer.objects.create(name="desk", tools=["meteo__*"])
    yield server
    VirtualServer.objects.filter(name__in=("desk", "other")).delete()


def test_a_servers_override_stacks_on_the_upstreams_and_cannot_bring_back_what_it_fixes():
    base, top = override_parse(CURATED), override_parse({"name": "outlook", "params": {"place": {"name": "town"}}})
    shown = base.definition(WEATHER)
    override_check(top, shown)
    stacked = override_stack(base, top)
    seen = stacked.definition(WEATHER)

    assert seen["title"] == "Forecast" and seen["description"] == "Today's forecast for a city."
    assert seen["inputSchema"]["properties"] == {
        "town": {"type": "string", "enum": ["Paris", "Oslo"], "description": "Where"}
    }
    assert stacked.arguments({"town": "Oslo"}, seen["inputSchema"]) == {"city": "Oslo", "units": "metric"}
    assert list(seen["outputSchema"]["properties"]) == ["temperature"]
    assert stacked.name == "outlook" and override_stack(None, top) == top


def test_the_server_sees_its_override_and_mcp_the_upstreams(desk, weather):  # noqa: F811
    mark = audit_mark()
    server_override_set(server=desk, tool=weather, data=DESK, actor="olga")
    alice = agent_create(name="desk-alice").agent
    snap = snapshot_compile()
    through, plain = Who(alice.id, server="desk"), Who(alice.id)
    entry = snap.tool(through, "meteo__outlook")

    assert snap.tool(through, "meteo__forecast") is None and snap.tool(plain, "meteo__forecast") is not None
    assert snap.tool(plain, "meteo__outlook") is None
    assert list(entry.definition["inputSchema"]["properties"]) == ["town"]
    assert (entry.definition["name"], entry.route.tool, entry.sha256) == ("meteo__outlook", "weather", "sha-weather")
    assert snap.listed_name(through, "meteo__outlook") == "meteo__forecast"
    assert {name for name in snap.tools_for(through) if name.startswith("meteo__")} == {
        "meteo__outlook",
        "meteo__alerts",
    }
    server_override_clear(server=desk, tool=weather, actor="olga")
    rows = AuditEvent.objects.filter(id__gt=mark, server="desk").order_by("id").values_list("tool", "detail")
    assert [(tool, detail["action"]) for tool, detail in rows] == [
        ("weather", "server_override_set"),
        ("weather", "server_override_cleared"),
    ]
    assert snapshot_compile().tool(through, "meteo__forecast") is not None


@pytest.mark.parametrize(
    "data, error",
    [
        ({"name": "alerts"}, "Tools 'weather' and 'alerts' would both be exposed as 'meteo__alerts' in virtual server "
                             "'desk'."),
        ({"name": "for cast"}, "The name 'for cast' is refused (not 1-128 characters of A-Z a-z 0-9 _ - .)."),
        ({"params": {"city": {"name": "town"}}}, "The tool has no parameter 'city'."),  # /mcp shows it as 'place'
        ({"params": {"units": {"value": "imperial"}}}, "The tool has no parameter 'units'."),  # the upstream's fixed it
        ({"params": {"verbose": {"value": True}}}, "The tool has no parameter 'verbose'."),  # ...and hid this one
        ({"params": {"place": {"hidden": True}}}, "Parameter 'place' is required: give it a fixed value to hide it."),
        ({"output": ["humidity"]}, "The tool's outputSchema has no field 'humidity'."),
    ],
)  # fmt: skip
def test_the_service_refuses_a_servers_override_that_does_not_fit_with_its_exact_error(desk, weather, data, error):  # noqa: F811
    with pytest.raises(ValidationError) as refused:
        server_override_set(server=desk, tool=weather, data=data, actor="olga")
    assert refused.value.message_dict == {"override": [error]}
    assert not ServerToolOverride.objects.filter(server=desk).exists()


def test_a_tool_the_server_does_not_offer_cannot_be_overridden_there(desk, weather):  # noqa: F811
    desk.tools = ["meteo__alerts"]
    desk.save()
    with pytest.raises(ValidationError) as refused:
        server_override_set(server=desk, tool=weather, data=DESK, actor="olga")
    assert refused.value.message_dict == {
        "override": ["The virtual server 'desk' does not offer 'meteo__forecast': list it in its tools to override it."]
    }


def test_a_tool_the_servers_team_does_not_reach_cannot_be_overridden_there(desk, weather):  # noqa: F811
    default, ops = desk.team, Team.objects.create(slug="ops", name="Ops")
    try:
        VirtualServer.objects.filter(pk=desk.pk).update(team=ops)
        desk.refresh_from_db()
        with pytest.raises(ValidationError) as refused:
            server_override_set(server=desk, tool=weather, data=DESK, actor="olga")
    finally:
        VirtualServer.objects.filter(pk=desk.pk).update(team=default)
        ops.delete()
    assert refused.value.message_dict == {
        "override": ["The virtual server 'desk' does not offer 'meteo__forecast': list it in its tools to override it."]
    }


def test_two_of_a_servers_overrides_under_one_name_are_refused_naming_both(desk, weather):  # noqa: F811
    alerts = Tool.objects.get(upstream=weather.upstream, name="alerts")
    server_override_set(server=desk, tool=alerts, data={"name": "now"}, actor="olga")
    other = VirtualServer.objects.create(name="other", tools=["meteo__*"])
    server_override_set(server=other, tool=weather, data={"name": "now"}, actor="olga")  # another server: its own
    with pytest.raises(ValidationError) as refused:
        server_override_set(server=desk, tool=weather, data={"name": "now"}, actor="olga")
    assert refused.value.message_dict == {
        "override": ["Tools 'weather' and 'alerts' would both be exposed as 'meteo__now' in virtual server 'desk'."]
    }
    assert server_overrides_json(server=other) == {"meteo/weather": {"name": "now"}}


def _page(server: VirtualServer, row: dict) -> dict:
    """The virtual server's change form as the console posts it, with one inline override."""
    return {
        "name": server.name, "team": server.team_id, "title": "", "instructions": "", "tools": '["meteo__*"]',
        "resources": "[]", "prompts": "[]", "enabled": "on",
        "overrides-TOTAL_FORMS": "1", "overrides-INITIAL_FORMS": "0", "overrides-MIN_NUM_FORMS": "0",
        "overrides-MAX_NUM_FORMS": "1000",
        "overrides-0-title": "", "overrides-0-description": "", "overrides-0-annotations": "null",
        "overrides-0-params": "{}", "overrides-0-output": "[]",
    } | {f"overrides-0-{key}": value for key, value in row.items()}  # fmt: skip


def test_the_console_sets_a_servers_override_inline_through_the_service_and_refuses_one_that_does_not_fit(
    admin_client,
    desk,
    weather,  # noqa: F811
):
    page, mark = f"/admin/registry/virtualserver/{desk.pk}/change/", audit_mark()
    refused = admin_client.post(page, _page(desk, {"tool": weather.pk, "name": "alerts"}))
    saved = admin_client.post(page, _page(desk, {"tool": weather.pk, "name": "outlook"}))
    rows = AuditEvent.objects.filter(id__gt=mark, server="desk", detail__action="server_override_set")

    assert refused.status_code == 200
    assert (
        "Tools &#x27;weather&#x27; and &#x27;alerts&#x27; would both be exposed as &#x27;meteo__alerts&#x27; in "
        "virtual server &#x27;desk&#x27;." in refused.content.decode()
    )
    assert saved.status_code == 302
    assert server_overrides_json(server=desk) == {"meteo/weather": {"name": "outlook"}}
    assert [row.actor for row in rows] == ["operator"]
