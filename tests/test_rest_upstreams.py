"""REST services as upstreams (kind `rest`): examples/rest_service.py and the gateway's own REST API, registered
from their OpenAPI documents and called through /mcp in both eras and through both executors."""

import itertools
import json
from pathlib import Path
from urllib.parse import unquote

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from mcp.shared.exceptions import MCPError

from policy.models import default_team
from registry.models import Tool, Upstream
from registry.services import upstream_catalog_sync, upstream_register, upstream_save
from tests import servers
from tests.clients import api, sdk_client, tool_names
from tests.helpers import audit_mark, audit_since, eventually, run

TOKEN = "rest-token-5b1e-not-for-anyone-else"
PEOPLE = {"alice": "rest-alice-7c2d9e", "bob": "rest-bob-1f8a3b", "admin": "rest-admin-4e6c0d"}
ERAS = ("legacy", "2026-07-28")


@pytest.fixture(scope="module")
def note(logs) -> Path:
    return logs / "rest-service-note.txt"


@pytest.fixture(scope="module")
def service(logs, note):
    tokens = ",".join(f"{name}:{token}" for name, token in ({"service": TOKEN} | PEOPLE).items())
    running = servers.start_rest_service(logs / "rest-service.log", tokens, note)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def inventory(world, service):
    """The example service from its document, with its bearer token (sealed) as a shared credential."""
    upstream = Upstream(
        slug="inventory",
        transport="rest",
        openapi_url=f"{service.url}/openapi.json",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=2.0,
        breaker_failures=1000,
    )
    upstream_save(upstream=upstream, created=True)
    report = upstream_catalog_sync(upstream=upstream)
    assert report.ok, report.summary()
    yield upstream
    upstream.delete()


def _call(gateway, key, name, arguments, mode="legacy"):
    async def scenario():
        async with sdk_client(gateway.url, key, mode) as client:
            return await client.call_tool(name, arguments)

    return run(scenario)


def _tools(gateway, key, mode="legacy"):
    async def scenario():
        async with sdk_client(gateway.url, key, mode) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    return run(scenario)


def _offered(gateway, key: str, tool: str) -> None:
    """Wait until the gateway's snapshot knows the new key and offers the new upstream's tool (within a second)."""

    async def listed() -> bool:
        try:
            return tool in await tool_names(gateway.url, key)
        except MCPError:  # the key is not in the gateway's snapshot yet
            return False

    eventually(lambda: run(listed))


def test_a_documents_operations_are_tools_with_schemas_from_it(gateway, world, inventory):
    _offered(gateway, world.key, "inventory__getItem")
    tools = _tools(gateway, world.key)
    names = {name for name in tools if name.startswith("inventory__")}
    assert names == {
        f"inventory__{op}"
        for op in (
            "listItems",
            "createItem",
            "getItem",
            "whoAmI",
            "echoPath",
            "slow",
            "fail",
            "big",
            "products",
            "redirectPrivate",
            "redirectHome",
        )  # fmt: skip
    }
    get_item = tools["inventory__getItem"]
    assert get_item.description.startswith("One item by its id.")
    assert get_item.input_schema["required"] == ["item_id"]
    assert get_item.output_schema["properties"]["name"] == {"type": "string"}
    # An array answer is wrapped: structuredContent must be an object.
    assert tools["inventory__listItems"].output_schema["required"] == ["result"]


@pytest.mark.parametrize("mode", ERAS)
def test_a_rest_call_returns_json_as_structured_content(gateway, world, inventory, mode):
    result = _call(gateway, world.key, "inventory__getItem", {"item_id": "5"}, mode)
    assert not result.is_error
    assert result.structured_content == {"id": "5", "name": "item 5"}
    listed = _call(gateway, world.key, "inventory__listItems", {"limit": 2}, mode)
    assert listed.structured_content == {"result": [{"id": "1", "name": "item 1"}, {"id": "2", "name": "item 2"}]}


def test_a_json_body_is_sent_and_the_answer_audited(gateway, world, inventory):
    mark = audit_mark()
    result = _call(gateway, world.key, "inventory__createItem", {"body": {"name": "lamp"}})
    assert result.structured_content == {"id": "42", "name": "lamp"}
    rows = sorted((row for row in audit_since(mark) if row.exposed_name == "inventory__createItem"), key=lambda r: r.id)
    assert [(row.kind, row.upstream, row.tool) for row in rows] == [
        ("approved", "inventory", "createItem"),
        ("completed", "inventory", "createItem"),
    ]
    assert rows[1].outcome == "ok"


def test_a_non_2xx_answer_is_an_error_result_without_the_credential(gateway, world, inventory):
    failed = _call(gateway, world.key, "inventory__fail", {})
    assert failed.is_error
    text = failed.content[0].text
    assert text.startswith("HTTP 500") and text.endswith("boom: the request carried [credential]")
    assert TOKEN not in text
    missing = _call(gateway, world.key, "inventory__getItem", {"item_id": "missing"})
    assert missing.is_error and missing.content[0].text.startswith("HTTP 404")


@pytest.mark.parametrize("value", ["../items", "..", ".", "a/b", "x%2Fy", "line\r\nbreak"])
def test_a_path_parameter_stays_one_segment(inline_gateway, world, inventory, value):
    result = _call(inline_gateway, world.key, "inventory__echoPath", {"value": value})
    assert not result.is_error, result.content[0].text
    raw = result.structured_content["raw_path"]
    assert raw.startswith("/echo/") and raw.count("/") == 2  # one segment, however it was written
    assert unquote(raw.removeprefix("/echo/")) == value


def test_a_header_parameter_carrying_crlf_is_refused(inline_gateway, world, inventory):
    result = _call(inline_gateway, world.key, "inventory__echoPath", {"value": "v", "note": "a\r\nX-Evil: 1"})
    assert result.is_error
    assert "header" in result.content[0].text and "line break" in result.content[0].text


def test_an_xml_answer_is_text(inline_gateway, world, inventory):
    result = _call(inline_gateway, world.key, "inventory__products", {})
    assert not result.is_error and "<title>Chai</title>" in result.content[0].text
    assert result.structured_content is None


def test_an_oversized_answer_is_cut_at_the_limit(inline_gateway, world, inventory):
    result = _call(inline_gateway, world.key, "inventory__big", {})
    text = result.content[0].text
    assert len(text.encode()) < 1024 * 1024 + 1000
    assert "cut" in text


def test_a_slow_answer_times_out(inline_gateway, world, inventory):
    result = _call(inline_gateway, world.key, "inventory__slow", {"seconds": 5})
    assert result.is_error and "did not answer within 2 seconds" in result.content[0].text


def test_a_redirect_within_the_service_is_followed_and_one_to_a_private_address_refused(
    inline_gateway, world, inventory
):
    home = _call(inline_gateway, world.key, "inventory__redirectHome", {})
    assert home.structured_content == {"id": "7", "name": "item 7"}
    private = _call(inline_gateway, world.key, "inventory__redirectPrivate", {})
    assert private.is_error
    assert "does not connect to this service's network address" in private.content[0].text


HOSTILE = {
    "broken-ref.json": "points at nothing",
    "cycle.json": "is recursive (#/components/schemas/A -> #/components/schemas/B -> #/components/schemas/A)",
    "external-ref.json": "127.0.0.2",
    "servers-private.json": "10.0.0.1",
    "bomb.yaml": "YAML aliases",
    "huge.json": "limit",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_document_is_refused_and_nothing_registered(db, service, name, settings):
    settings.GATEWAY_EXECUTOR = "inline"
    upstream = Upstream(slug="hostile", transport="rest", openapi_url=f"{service.url}/hostile/{name}")
    upstream_save(upstream=upstream, created=True)
    report = upstream_register(upstream=upstream, actor="tests")
    assert not report.ok and report.code == "REST_DOCUMENT_REFUSED"
    assert report.error.startswith("REST_DOCUMENT_REFUSED: The service's OpenAPI document was refused: ")
    assert HOSTILE[name] in report.error
    assert not Upstream.objects.filter(slug="hostile").exists()
    assert not Tool.objects.filter(upstream__slug="hostile").exists()


def test_the_gateways_own_api_is_an_upstream_of_another_gateway(celery_gateway, inline_gateway, world, admin_token):
    """The inline gateway's REST API, from its schema at /api/v1/schema, called through the Celery gateway (another
    instance, its worker making the request) and through the inline gateway itself."""
    upstream = Upstream(
        slug="gateway-api",
        transport="rest",
        openapi_url=f"{inline_gateway.url}/api/v1/schema",
        headers={"Authorization": f"Bearer {admin_token}"},
        read_only=True,
        rest_select={"include": ["upstreams_list"]},
    )
    upstream_save(upstream=upstream, created=True)
    try:
        report = upstream_catalog_sync(upstream=upstream)
        assert report.ok and report.added == ["upstreams_list"], report.summary()
        for through, mode in itertools.product((celery_gateway, inline_gateway), ERAS):
            _offered(through, world.key, "gateway-api__upstreams_list")
            listed = _call(through, world.key, "gateway-api__upstreams_list", {}, mode)
            assert not listed.is_error, listed.content[0].text
            slugs = {row["slug"] for row in listed.structured_content["result"]}
            assert {"time", "demo", "gateway-api"} <= slugs
    finally:
        upstream.delete()


def test_the_rest_api_registers_a_rest_upstream_and_its_tools(inline_gateway, service, admin_token):
    sent = {
        "slug": "inventory-api",
        "transport": "rest",
        "openapi_url": f"{service.url}/openapi.json",
        "headers": {"Authorization": f"Bearer {TOKEN}"},
        "read_only": True,
    }
    answer = api(inline_gateway, "POST", "upstreams", admin_token, json=sent)
    try:
        assert answer.status_code == 201, answer.text
        assert answer.json()["headers"] == {"Authorization": "********"} and answer.json()["read_only"] is True
        names = set(Tool.objects.filter(upstream__slug="inventory-api").values_list("name", flat=True))
        assert "getItem" in names and "createItem" not in names  # read-only: GET and HEAD only
    finally:
        Upstream.objects.filter(slug="inventory-api").delete()


def test_the_rest_api_refuses_a_hostile_document_with_its_reason(inline_gateway, service, admin_token):
    sent = {"slug": "hostile-api", "transport": "rest", "openapi_url": f"{service.url}/hostile/cycle.json"}
    answer = api(inline_gateway, "POST", "upstreams", admin_token, json=sent)
    assert answer.status_code == 400
    assert answer.json()["openapi_url"][0].startswith("REST_DOCUMENT_REFUSED: The service's OpenAPI document")
    assert api(inline_gateway, "GET", "upstreams/hostile-api", admin_token).status_code == 404


@pytest.fixture(scope="module")
def people_keys(db):
    """Alice and Bob, each with a personal key of one agent."""
    from django.contrib.auth import get_user_model

    from policy.models import Agent
    from policy.services import agent_key_issue

    agent = Agent.objects.get_or_create(name="rest-people")[0]
    users = {name: get_user_model().objects.create_user(f"{name}-rest", first_name=name.title()) for name in PEOPLE}
    yield {name: (user, agent_key_issue(agent=agent, owner=user, actor="tests").key) for name, user in users.items()}
    for user in users.values():
        user.delete()


def test_each_person_calls_a_per_person_rest_service_with_their_own_token(gateway, world, service, people_keys):
    from registry.personal import personal_connect
    from tests.factories import person_upstream

    upstream = person_upstream(
        "inventory-pp", PEOPLE["admin"], transport="rest", openapi_url=f"{service.url}/openapi.json"
    )
    try:
        for name in ("alice", "bob"):
            user, _ = people_keys[name]
            values = {"token": PEOPLE[name]}
            personal_connect(
                upstream=upstream,
                issuer=gateway.url,
                subject=str(user.pk),
                name=user.first_name,
                kind="token",
                values=values,
            )
        for name in ("alice", "bob"):
            _offered(gateway, people_keys[name][1], "inventory-pp__whoAmI")
            result = _call(gateway, people_keys[name][1], "inventory-pp__whoAmI", {})
            assert result.structured_content == {"caller": name}, result.content[0].text
    finally:
        upstream.delete()


def test_a_changed_document_is_synced_again_and_its_changed_operation_held(world, service, note):
    """A probe finds the document changed and the catalog is synced again: the changed operation waits for an
    administrator, as a changed MCP tool does."""
    from registry.services import tool_approve, upstream_health_probe

    upstream = Upstream(slug="inventory-notes", transport="rest", openapi_url=f"{service.url}/openapi.json")
    upstream.headers = {"Authorization": f"Bearer {TOKEN}"}
    upstream_save(upstream=upstream, created=True)
    try:
        assert upstream_catalog_sync(upstream=upstream).ok
        tool = Tool.objects.get(upstream=upstream, name="getItem")
        assert tool.is_approved and tool.description == "One item by its id."
        note.write_text("Now with prices.")
        upstream_health_probe()  # the executor's probe reads the document again and announces the change
        tool = eventually(
            lambda: Tool.objects.filter(upstream=upstream, name="getItem", description__contains="prices").first()
        )
        assert not tool.is_approved and tool.description == "One item by its id.\n\nNow with prices."
        tool_approve(tool=tool, actor="tests")
        assert Tool.objects.get(pk=tool.pk).is_approved
    finally:
        note.unlink(missing_ok=True)
        upstream.delete()


def test_a_document_uploaded_in_the_admin_registers_its_operations(admin_client, service, world):
    document = json.dumps(json.loads(servers_document(service)))
    form = {
        "slug": "inventory-upload",
        "name": "",
        "transport": "rest",
        "url": service.url,
        "headers": json.dumps({"Authorization": f"Bearer {TOKEN}"}),
        "timeout": "5",
        "enabled": "on",
        "new_tools": "approve",
        "person_connect": "token",
        "person_slot": "bearer",
        "person_client": "{}",
        "rest_select": json.dumps({"include": ["getItem", "listItems"]}),
        "tools-TOTAL_FORMS": "0",
        "tools-INITIAL_FORMS": "0",
        "team": default_team(),
        "openapi_file": SimpleUploadedFile("openapi.json", document.encode(), "application/json"),
    }
    added = admin_client.post("/admin/registry/upstream/add/", form, follow=True)
    try:
        messages = [str(m) for m in added.context["messages"]]
        assert messages[-1] == "inventory-upload: 2 added, 0 changed, 0 removed, 0 rejected", messages
        upstream = Upstream.objects.get(slug="inventory-upload")
        assert json.loads(upstream.openapi_document)["info"]["title"] == "Inventory"
    finally:
        Upstream.objects.filter(slug="inventory-upload").delete()


def test_an_upload_over_the_limit_is_refused_by_the_form(admin_client, db, settings):
    settings.GATEWAY_REST_DOCUMENT_MAX_BYTES = 2048
    form = {"slug": "too-big", "transport": "rest", "timeout": "5", "new_tools": "hold", "person_connect": "token"}
    form |= {"person_slot": "bearer", "tools-TOTAL_FORMS": "0", "tools-INITIAL_FORMS": "0"}
    form["openapi_file"] = SimpleUploadedFile("openapi.json", b" " * 4096, "application/json")
    page = admin_client.post("/admin/registry/upstream/add/", form)
    assert page.status_code == 200  # the form again, with its error
    assert "The uploaded document is 4,096 bytes; the limit is 2,048." in page.content.decode()
    assert not Upstream.objects.filter(slug="too-big").exists()


def test_operations_declared_by_hand_in_an_imported_config_are_tools_and_export_back(db, service, world):
    from handoff.config_import import entry_export, mcp_config_import

    operations = [
        {
            "name": "item",
            "method": "GET",
            "path": "/items/{id}",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
            "output": {"type": "object"},
        }
    ]
    entry = {"type": "rest", "url": service.url, "operations": operations, "headers": {"Authorization": "Bearer ${T}"}}
    report = mcp_config_import(config={"mcpServers": {"declared": entry}}, actor="tests", environ={"T": TOKEN})
    upstream = Upstream.objects.get(slug="declared")
    try:
        assert [o.action for o in report.entries] == ["created"]
        assert upstream_catalog_sync(upstream=upstream).added == ["item"]
        # The entry alone: a whole export refuses upstreams of other tests' that the file cannot say.
        exported = entry_export(upstream, "declared", {}, routes=True)
        assert exported == {
            "type": "rest",
            "operations": operations,
            "url": service.url,
            "headers": {"Authorization": "${DECLARED_HEADER_AUTHORIZATION}"},
        }
    finally:
        upstream.delete()


def test_an_import_refuses_a_document_at_a_private_address(db):
    from handoff.config_import import mcp_config_import

    entry = {"openapi": "http://10.1.2.3/openapi.json"}
    report = mcp_config_import(config={"mcpServers": {"private": entry}}, actor="tests")
    [outcome] = report.entries
    assert outcome.action == "rejected"
    assert outcome.why.startswith("openapi: 10.1.2.3 is not a public address. Pass --internal")
    assert not Upstream.objects.filter(slug="private").exists()


def servers_document(service) -> str:
    import httpx2

    return httpx2.get(f"{service.url}/openapi.json").text
