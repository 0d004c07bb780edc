"""deploy/: the Grafana dashboard and the Prometheus alert rules load, and every metric their expressions
name is one a real gateway exports (Celery mode, where every metric exists, after a call and a denial)."""

import json
import re
from pathlib import Path

import pytest
import yaml
from mcp.shared.exceptions import MCPError

from tests.clients import call
from tests.helpers import run, scrape

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
METRIC = re.compile(r"\bswitchboard_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "switchboard.json").read_text())
    targets = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    variables = [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return targets + variables


def alert_rules() -> list[dict]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "switchboard-alerts.yaml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


@pytest.fixture(scope="module")
def exported(celery_gateway, world) -> set[str]:
    """Every series name the gateway's /metrics declares, with the suffixes its types add."""
    assert not run(lambda: call(celery_gateway.url, world.key, "demo__echo", {"text": "scraped"})).is_error
    assert isinstance(run(lambda: call(celery_gateway.url, world.key, "demo__no_such_tool")), MCPError)
    families = scrape(celery_gateway)
    return {family.name + suffix for family in families for suffix in SUFFIXES.get(family.type, ("",))}


def test_the_dashboard_shows_what_operators_watch_with_metrics_the_gateway_exports(exported):
    expressions = dashboard_expressions()
    named = {name for expression in expressions for name in METRIC.findall(expression)}
    assert all(METRIC.search(expression) for expression in expressions)
    assert named - exported == set()
    watched = {
        "switchboard_tool_calls_total",
        "switchboard_tool_call_seconds_bucket",
        "switchboard_tool_denials_total",
        "switchboard_circuit_state",
        "switchboard_upstream_up",
        "switchboard_workers_alive",
        "switchboard_http_requests_total",
    }
    assert watched <= named


def test_every_alert_rule_is_complete_and_uses_metrics_the_gateway_exports(exported):
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} == {
        "SwitchboardUpstreamDown",
        "SwitchboardToolErrorRatioHigh",
        "SwitchboardCircuitOpen",
        "SwitchboardNoWorkersAlive",
        "SwitchboardToolLatencyHigh",
        "SwitchboardAuditUnavailable",
        "SwitchboardHttpServerErrors",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
        assert METRIC.findall(rule["expr"]) and set(METRIC.findall(rule["expr"])) <= exported, rule["alert"]
    down = next(rule for rule in rules if rule["alert"] == "SwitchboardUpstreamDown")
    assert (down["expr"], down["for"]) == ("max by (upstream) (switchboard_upstream_up) == 0", "5m")
