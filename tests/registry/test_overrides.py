"""Tool overrides (issue 38, scope 2): the value applied to a definition, the arguments mapped back, the result
trimmed, and every override the service refuses, each with its exact error."""

from collections.abc import Iterator

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from audit.models import AuditEvent
from handoff.snapshot import snapshot_compile
from policy.models import Team
from registry.models import Tool, ToolOverride, Upstream
from registry.overrides import ArgumentsRefused, OverrideRefused, override_check, override_json, override_parse
from registry.services import local_prefix_set, tool_override_clear, tool_override_set
from tests.helpers import audit_mark

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]},
        "units": {"type": "string", "description": "Metric or imperial"},
        "verbose": {"type": "boolean"},
    },
    "required": ["city", "units"],
}
WEATHER = {
    "name": "weather",
    "description": "The weather.",
    "inputSchema": SCHEMA,
    "outputSchema": {
        "type": "object",
        "properties": {"temperature": {"type": "number"}, "humidity": {"type": "number"}},
        "required": ["temperature", "humidity"],
    },
}
CURATED = {
    "name": "forecast",
    "title": "Forecast",
    "description": "Today's forecast for a city.",
    "annotations": {"readOnlyHint": True},
    "params": {
        "city": {"name": "place", "description": "Where"},
        "units": {"value": "metric"},
        "verbose": {"hidden": True},
    },
    "output": ["temperature"],
}


def test_an_override_presents_the_definition_maps_arguments_back_and_trims_the_result():
    override = override_parse(CURATED)
    shown = override.definition(WEATHER)
    sent = override.arguments({"place": "Oslo"}, shown["inputSchema"])
    result = override.result(
        {"content": [{"type": "text", "text": "{...}"}], "structuredContent": {"temperature": 3, "humidity": 80}}
    )

    assert shown["title"] == "Forecast" and shown["description"] == "Today's forecast for a city."
    assert shown["annotations"] == {"readOnlyHint": True}
    assert shown["inputSchema"] == {
        "type": "object",
        "properties": {"place": {"type": "string", "enum": ["Paris", "Oslo"], "description": "Where"}},
        "required": ["place"],
    }
    assert shown["outputSchema"]["properties"] == {"temperature": {"type": "number"}}
    assert shown["outputSchema"]["required"] == ["temperature"]
    assert sent == {"city": "Oslo", "units": "metric"}
    assert result == {
        "content": [{"type": "text", "text": '{"temperature": 3}'}],
        "structuredContent": {"temperature": 3},
    }
    assert override_parse(override_json(override)) == override


@pytest.mark.parametrize(
    "given, error",
    [
        ({"place": "Oslo", "verbose": True}, "Additional properties are not allowed ('verbose' was unexpected)"),
        ({"place": "Oslo", "units": "imperial"}, "Additional properties are not allowed ('units' was unexpected)"),
        ({"place": "Rome"}, "'Rome' is not one of ['Paris', 'Oslo'] (at place)"),
        ({}, "'place' is a required property"),
    ],
)
def test_arguments_the_exposed_schema_refuses_are_refused_with_its_error(given, error):
    override = override_parse(CURATED)
    with pytest.raises(ArgumentsRefused) as refused:
        override.arguments(given, override.definition(WEATHER)["inputSchema"])
    assert str(refused.value) == error


def test_an_error_or_unstructured_result_is_left_as_the_upstream_gave_it():
    override = override_parse(CURATED)
    failed = {"isError": True, "content": [{"type": "text", "text": "no"}], "structuredContent": {"humidity": 1}}
    plain = {"content": [{"type": "text", "text": "sunny"}]}
    assert (override.result(failed), override.result(plain)) == (failed, plain)


def test_an_upstream_schema_that_cannot_be_checked_refuses_the_fixed_value_and_the_call_not_the_gateway():
    broken = {"name": "t", "inputSchema": {"type": "object", "properties": {"a": {"type": 5}, "b": {"type": "string"}}}}
    renamed = override_parse({"params": {"b": {"name": "c"}}})
    with pytest.raises(OverrideRefused) as fixed:
        override_check(override_parse({"params": {"a": {"value": 1}}}), broken)
    with pytest.raises(ArgumentsRefused) as called:
        renamed.arguments({"c": "x", "a": 1}, renamed.definition(broken)["inputSchema"])
    assert (
        str(fixed.value)
        == str(called.value)
        == "The tool's input schema cannot be checked: 'int' object is not iterable"
    )


@pytest.mark.parametrize(
    "data, error",
    [
        ([], "An override is an object of annotations, description, name, output, params, title."),
        ({"rename": "x"}, "An override is an object of annotations, description, name, output, params, title: "
                          "'rename' is not one of them."),
        ({"params": {"city": {"hide": True}}}, "Parameter 'city': give an object of description, hidden, name, value."),
        ({"params": {"city": {"name": "a b"}}},
         "Parameter 'city': the name 'a b' is not 1-128 characters of A-Z a-z 0-9 _ - ."),
        ({"output": "temperature"}, "'output' must be a list of structuredContent field names."),
    ],
)  # fmt: skip
def test_a_malformed_override_is_refused_naming_what(data, error):
    with pytest.raises(OverrideRefused) as refused:
        override_parse(data)
    assert str(refused.value) == error


def _tool(upstream: Upstream, definition: dict) -> Tool:
    return Tool.objects.create(
        upstream=upstream, name=definition["name"], definition=definition,
        definition_sha256=f"sha-{definition['name']}", approved_sha256=f"sha-{definition['name']}",
        last_seen_at=timezone.now(),
    )  # fmt: skip


@pytest.fixture
def weather(db) -> Iterator[Tool]:
    upstream = Upstream.objects.create(slug="meteo", transport="stdio", command="x")
    _tool(upstream, {"name": "alerts", "inputSchema": {"type": "object"}})
    yield _tool(upstream, WEATHER)
    upstream.delete()


@pytest.mark.parametrize(
    "data, error",
    [
        ({"name": "for cast"}, "The name 'for cast' is refused (not 1-128 characters of A-Z a-z 0-9 _ - .)."),
        ({"name": "constructor"}, "The name 'constructor' is refused (a reserved name)."),
        ({"name": "alerts"}, "Tools 'weather' and 'alerts' would both be exposed as 'meteo__alerts'."),
        ({"params": {"units": {"value": 7}}},
         "The fixed value for 'units' fails the tool's schema: 7 is not of type 'string'."),
        ({"params": {"city": {"value": "Rome"}}},
         "The fixed value for 'city' fails the tool's schema: 'Rome' is not one of ['Paris', 'Oslo']."),
        ({"params": {"units": {"hidden": True}}}, "Parameter 'units' is required: give it a fixed value to hide it."),
        ({"params": {"colour": {"hidden": True}}}, "The tool has no parameter 'colour'."),
        ({"params": {"verbose": {"name": "city"}}}, "Parameters 'city' and 'verbose' would both be named 'city'."),
        ({"output": ["pressure"]}, "The tool's outputSchema has no field 'pressure'."),
    ],
)  # fmt: skip
def test_the_service_refuses_an_override_that_does_not_fit_with_its_exact_error(weather, data, error):
    with pytest.raises(ValidationError) as refused:
        tool_override_set(tool=weather, data=data, actor="olga")
    assert refused.value.message_dict == {"override": [error]}
    assert not ToolOverride.objects.filter(tool=weather).exists()


def test_two_overrides_mapping_to_one_exposed_name_are_refused_naming_both(weather):
    alerts = Tool.objects.get(upstream=weather.upstream, name="alerts")
    tool_override_set(tool=alerts, data={"name": "now"}, actor="olga")
    with pytest.raises(ValidationError) as refused:
        tool_override_set(tool=weather, data={"name": "now"}, actor="olga")
    assert refused.value.message_dict == {
        "override": ["Tools 'weather' and 'alerts' would both be exposed as 'meteo__now'."]
    }


def test_the_snapshot_exposes_the_override_and_keeps_the_upstreams_hash_and_rules_name(weather):
    mark = audit_mark()
    tool_override_set(tool=weather, data=CURATED, actor="olga")
    entry = snapshot_compile().tools["meteo__forecast"]
    cleared_before = snapshot_compile().tools.keys()
    tool_override_clear(tool=weather, actor="olga")
    after = snapshot_compile().tools.keys()
    rows = list(AuditEvent.objects.filter(id__gt=mark, tool="weather").order_by("id").values_list("actor", "detail"))

    assert entry.definition["name"] == "meteo__forecast"
    assert list(entry.definition["inputSchema"]["properties"]) == ["place"]
    assert (entry.sha256, entry.route.tool, entry.target.tool) == ("sha-weather", "weather", "weather")
    assert "meteo__weather" not in cleared_before and "meteo__weather" in after
    assert [(actor, detail["action"]) for actor, detail in rows] == [
        ("olga", "tool_override_set"),
        ("olga", "tool_override_cleared"),
    ]
    assert rows[0][1]["after"] == override_parse(CURATED).digest == rows[1][1]["before"]


def test_a_borrowing_team_sees_the_overridden_tool_under_its_local_prefix(weather):
    ops = Team.objects.create(slug="ops", name="Ops")
    try:
        weather.upstream.shared_with.add(ops)
        local_prefix_set(upstream=weather.upstream, team=ops, prefix="sky", actor="olga")
        tool_override_set(tool=weather, data=CURATED, actor="olga")
        local = snapshot_compile().local["ops"]
    finally:
        ops.delete()
    assert {"sky__forecast", "sky__alerts"} == set(local)
    entry = local["sky__forecast"]
    assert (entry.definition["name"], entry.route.tool, entry.override) == (
        "sky__forecast",
        "weather",
        override_parse(CURATED),
    )
