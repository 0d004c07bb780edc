"""Upstreams over every transport the registry offers, and what the gateway sends them."""

import pytest

from registry.credentials import is_sealed
from registry.models import Upstream
from registry.services import upstream_catalog_sync, upstream_save
from tests import servers
from tests.clients import api, sdk_client
from tests.helpers import eventually, run

QUERY_KEY = "q-4567-not-for-anyone-else"


@pytest.fixture(scope="module")
def http_upstreams(world, everything_http, logs):
    """server-everything over HTTP+SSE, and the demo server over Streamable HTTP with a credential header and
    a key typed into its URL's query."""
    sse = servers.start_everything("sse", logs / "everything-sse.log")
    demo = servers.start_demo_http(logs / "demo-http.log")
    made = [
        Upstream(slug="every-sse", transport="sse", url=sse.url),
        Upstream(
            slug="demo-http",
            transport="streamable_http",
            url=f"{demo.url}?api_key={QUERY_KEY}&region=eu",
            headers={"X-Api-Key": "k-123"},
        ),
    ]
    for upstream in made:
        upstream_save(upstream=upstream, created=True)
        assert upstream_catalog_sync(upstream=upstream).ok
    yield
    for upstream in made:
        upstream.delete()
    sse.stop()
    demo.stop()


def _call(gateway, key, name, arguments):
    async def scenario():
        async with sdk_client(gateway.url, key, "legacy") as client:
            return await client.call_tool(name, arguments)

    return run(scenario)


def _listed(gateway, key) -> set[str]:
    async def scenario():
        async with sdk_client(gateway.url, key, "2026-07-28") as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    return run(scenario)


def test_an_sse_upstream_is_listed_and_called(gateway, world, http_upstreams):
    eventually(lambda: "every-sse__echo" in _listed(gateway, world.key))
    result = _call(gateway, world.key, "every-sse__echo", {"message": "over the older transport"})
    assert result.content[0].text == "Echo: over the older transport"


def test_configured_headers_reach_an_http_upstream(gateway, world, http_upstreams):
    eventually(lambda: "demo-http__header" in _listed(gateway, world.key))
    assert _call(gateway, world.key, "demo-http__header", {"name": "x-api-key"}).content[0].text == "k-123"
    # The agent's own credential is the gateway's business, never the upstream's.
    assert _call(gateway, world.key, "demo-http__header", {"name": "authorization"}).content[0].text == ""


def test_a_query_typed_into_the_url_is_sealed_and_still_reaches_the_upstream(
    gateway, world, http_upstreams, admin_client, admin_token, logs
):
    eventually(lambda: "demo-http__query" in _listed(gateway, world.key))
    # The very key reached it: echoed back, it is blanked out as the key (registry/upstreams/scrub.py).
    assert _call(gateway, world.key, "demo-http__query", {"name": "api_key"}).content[0].text == "[credential]"
    assert _call(gateway, world.key, "demo-http__query", {"name": "region"}).content[0].text == "eu"
    stored = Upstream.objects.get(slug="demo-http")
    assert "?" not in stored.url and sorted(stored.query) == ["api_key", "region"]
    assert all(is_sealed(value) for value in stored.query.values()) and QUERY_KEY not in str(stored.query)
    page = admin_client.get(f"/admin/registry/upstream/{stored.pk}/change/").content.decode()
    assert "api_key" in page and QUERY_KEY not in page
    read = api(gateway, "GET", "upstreams/demo-http", admin_token).json()
    assert (read["url"], read["query"]) == (stored.url, {"api_key": "********", "region": "********"})
    for log in logs.iterdir():  # the gateways' and the worker's logs among them
        assert QUERY_KEY not in log.read_text(errors="replace"), f"the key is in {log.name}"
