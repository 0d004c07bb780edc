"""Handoff from the operator's side: specialists imported from an mcpServers file, live tunnels in the
admin (closing one restores the agent's tools), and a worker that stops gracefully closing its tunnels."""

import json
import signal

from django.core.management import call_command

from handoff.models import HandoffRoute, Tunnel
from registry.models import Upstream
from tests import servers
from tests.clients import tool_names, watched_client
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
                listing = await _admin_get(admin_client, "/admin/handoff/tunnel/?state__exact=open")
                await _admin_post(
                    admin_client, "/admin/handoff/tunnel/", {"action": "close", "_selected_action": [str(tunnel.pk)]}
                )
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
    assert row.actor == "operator"


async def _admin_get(client, path):
    return await orm(lambda: client.get(path))


async def _admin_post(client, path, data):
    return await orm(lambda: client.post(path, data))


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
