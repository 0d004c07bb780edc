"""Handoff from the operator's side: specialists imported from an mcpServers file, live tunnels in the
admin (closing one restores the agent's tools), and a worker that stops gracefully closing its tunnels."""

import json
import signal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from audit.models import AuditEvent
from handoff.models import HandoffRoute, Tunnel
from registry.models import Upstream
from tests import servers
from tests.clients import sdk_client, tool_names, watched_client, ws_session
from tests.factories import agent
from tests.helpers import audit_mark, audit_since, eventually, orm, run


def test_an_imported_handoff_entry_becomes_a_route_to_a_handoff_only_upstream(
    inline_gateway, world, server_env, logs, tmp_path, capsys
):
    treasury = servers.start_specialist("treasury", server_env, inline_gateway.url, logs / "treasury.log")
    config = {
        "mcpServers": {
            "treasury": {"url": treasury.url, "handoff": {"description": "Money held by the company."}},
            "vague": {"url": treasury.url, "handoff": {"when": "sometimes"}},
        }
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    try:
        with pytest.raises(CommandError, match="1 of 2 entries were rejected or failed to sync"):
            call_command("import_mcp_config", str(tmp_path / "config.json"))
        printed = capsys.readouterr().out.splitlines()
        upstream = Upstream.objects.get(slug="treasury")
        route = HandoffRoute.objects.get(domain="treasury")
        with agent("cfo") as (_, key):
            names = eventually(lambda: run(lambda: tool_names(inline_gateway.url, key)) or None, timeout=10)
            eventually(lambda: "switchboard__handoff_to_treasury" in run(lambda: tool_names(inline_gateway.url, key)))

            async def scenario():
                async with watched_client(inline_gateway.url, key, "legacy") as (client, changes):
                    await client.call_tool("switchboard__handoff_to_treasury", {"reason": "cash"})
                    return (await client.call_tool("treasury__ask", {"question": "balance?"})).content[0].text

            answer = run(scenario)
    finally:
        Upstream.objects.filter(slug="treasury").delete()
        treasury.stop()
    assert printed == [
        "created  treasury (handoff target)",
        "rejected vague: 'handoff' must be an object with a 'description' saying when to hand off here",
    ]
    assert (
        upstream.handoff_only and route.target_id == upstream.id and route.description == "Money held by the company."
    )
    assert not any(name.startswith("treasury__") for name in names)  # reachable only during a handoff
    assert answer == "The treasury specialist's answer to 'balance?'."


def test_an_operator_sees_live_tunnels_and_closing_one_restores_the_agents_tools(
    celery_gateway, specialists, admin_client
):
    with agent("closed-on") as (_, key):
        eventually(lambda: "switchboard__handoff_to_finance" in run(lambda: tool_names(celery_gateway.url, key)))
        mark = audit_mark()

        async def scenario():
            async with watched_client(celery_gateway.url, key, "legacy") as (client, changes):
                await client.call_tool("switchboard__handoff_to_finance", {"reason": "watched"})
                await changes.next()
                tunnel = await orm(lambda: Tunnel.objects.get(agent__name="closed-on", state="open"))
                listing = await orm(lambda: admin_client.get("/admin/handoff/tunnel/?state__exact=open"))
                close = {"action": "close", "_selected_action": [str(tunnel.pk)]}
                await orm(lambda: admin_client.post("/admin/handoff/tunnel/", close))
                await changes.next()
                return tunnel, listing, {t.name for t in (await client.list_tools()).tools}

        tunnel, listing, names = run(scenario)
        rows = audit_since(mark)
        closed = Tunnel.objects.get(pk=tunnel.pk)
    assert (
        listing.status_code == 200
        and "closed-on" in listing.content.decode()
        and tunnel.worker_queue in listing.content.decode()
    )
    assert (closed.state, closed.close_reason) == ("closed", "closed by operator")
    assert "time__get_current_time" in names and "finance__ask" not in names
    [row] = [r for r in rows if r.kind == "handoff" and r.detail["event"] == "closed by operator"]
    assert (row.actor, row.team) == ("operator", "default")  # the team of the tunnel's agent


def test_a_worker_stopping_gracefully_closes_its_tunnels_and_tells_the_agents(isolated_celery):
    gateway, worker = isolated_celery
    with agent("graceful") as (_, key):
        eventually(lambda: "switchboard__handoff_to_finance" in run(lambda: tool_names(gateway.url, key)))

        async def scenario():
            async with watched_client(gateway.url, key, "2026-07-28") as (client, changes):
                await client.call_tool("switchboard__handoff_to_finance", {"reason": "until shutdown"})
                await changes.next()
                worker.process.send_signal(signal.SIGTERM)  # warm shutdown
                await changes.next(timeout=15)
                return {t.name for t in (await client.list_tools()).tools}

        names = run(scenario)
        [tunnel] = Tunnel.objects.filter(agent__name="graceful")
    assert (tunnel.state, tunnel.close_reason) == ("closed", "worker shutdown")
    assert "finance__ask" not in names and "time__get_current_time" in names


def test_a_session_that_ends_ends_its_handoff(inline_gateway, specialists):
    """A 2025-11-25 client that closes its session (DELETE), or a socket that closes, leaves no tunnel open."""
    with agent("leaver") as (_, key):
        eventually(lambda: "switchboard__handoff_to_finance" in run(lambda: tool_names(inline_gateway.url, key)))

        async def scenario():
            async with sdk_client(inline_gateway.url, key, "legacy") as client:
                await client.call_tool("switchboard__handoff_to_finance", {"reason": "then leave"})
            async with ws_session(inline_gateway.url, key) as ws:
                await ws.request(
                    "tools/call", {"name": "switchboard__handoff_to_finance", "arguments": {"reason": "ws"}}
                )

        run(scenario)
        tunnels = eventually(lambda: _all_closed(Tunnel.objects.filter(agent__name="leaver")))
    assert [(t.state, t.close_reason) for t in tunnels] == [("closed", "session ended")] * 2


def _all_closed(tunnels):
    tunnels = list(tunnels)
    return tunnels if len(tunnels) == 2 and all(t.state == "closed" for t in tunnels) else None


def test_the_embedded_default_closes_its_tunnels_when_it_stops(server_env, world, specialists, logs):
    gateway = servers.start_gateway(server_env | {"GATEWAY_EXECUTOR": "inline"}, logs / "gateway-stopping.log")
    try:
        with agent("left-behind") as (_, key):
            eventually(lambda: "switchboard__handoff_to_finance" in run(lambda: tool_names(gateway.url, key)))
            run(lambda: _hand_off_statelessly(gateway.url, key))
            gateway.stop()
            [tunnel] = Tunnel.objects.filter(agent__name="left-behind")
    finally:
        gateway.stop()
    assert (tunnel.state, tunnel.close_reason) == ("closed", "gateway shutdown")


async def _hand_off_statelessly(url: str, key: str) -> None:
    """2026-07-28: no session to end, so the tunnel stays open until something closes it."""
    async with sdk_client(url, key, "2026-07-28") as client:
        await client.call_tool("switchboard__handoff_to_finance", {"reason": "and stay"})


def test_a_route_made_in_the_admin_is_audited_and_offered_to_agents(inline_gateway, specialists, admin_client):
    from registry.models import Upstream

    finance = Upstream.objects.get(slug="finance")
    form = {
        "domain": "budget",
        "description": "Budget questions.",
        "target": finance.pk,
        "team": finance.team_id,
        "enabled": "on",
        "connect_timeout": "5",
        "max_sessions": "3",
        "idle_timeout": "60",
    }
    response = admin_client.post("/admin/handoff/handoffroute/add/", form)
    try:
        assert response.status_code == 302, response.content.decode()[:2000]
        route = HandoffRoute.objects.get(domain="budget")
        row = AuditEvent.objects.filter(actor="operator", detail__action="handoffroute_created").order_by("id").last()
        with agent("budgeteer") as (_, key):
            names = eventually(
                lambda: "switchboard__handoff_to_budget" in run(lambda: tool_names(inline_gateway.url, key))
            )
    finally:
        HandoffRoute.objects.filter(domain="budget").delete()
    assert (route.max_sessions, route.idle_timeout, route.target_id) == (3, 60.0, finance.pk)
    assert row.detail["after"]["domain"] == "budget" and names
