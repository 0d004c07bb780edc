"""A REST upstream's OpenAPI document, read before anything is registered (registry/rest/document.py): a real one
(the gateway's own) loads whole, and each hostile or broken one is refused with a message naming the fault,
without a fetch it should not make."""

import functools
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from django.core.management import call_command

from registry.rest.document import (
    DocumentLimits,
    DocumentRefused,
    document_base_url,
    document_load,
    document_parse,
    document_resolve,
)
from registry.upstreams.egress import EgressRefused

MB = 1024 * 1024
DOCUMENT_URL = "https://api.example.com/specs/openapi.yaml"


@pytest.fixture(autouse=True)
def egress_as_in_production(settings) -> None:
    """tests/settings.py lets the gateway reach loopback, where the test servers listen; not here."""
    settings.GATEWAY_EGRESS_ALLOWED_NETWORKS = []


def a_document(schemas: dict[str, Any] | None = None, answer: dict[str, Any] | None = None) -> dict[str, Any]:
    """A small valid OpenAPI 3.1 document: one GET /items answering `answer` (a schema)."""
    content = {"application/json": {"schema": answer or {"type": "object"}}}
    listing = {"operationId": "items_list", "responses": {"200": {"description": "ok", "content": content}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Items", "version": "1"},
        "paths": {"/items": {"get": listing}},
        "components": {"schemas": schemas or {}},
    }


def raw(document: dict[str, Any]) -> bytes:
    return json.dumps(document).encode()


class Fetcher:
    """A fetcher that serves fixed documents and remembers what it was asked for."""

    def __init__(self, documents: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.documents, self.error, self.asked = documents or {}, error, []

    async def __call__(self, url: str) -> bytes:
        self.asked.append(url)
        if self.error:
            raise self.error
        found = self.documents[url]
        return found if isinstance(found, bytes) else yaml.safe_dump(found).encode()


def load(document: dict[str, Any] | bytes, **options: Any) -> dict[str, Any]:
    options = {"document_url": None, "fetch": None, "internal": False} | options
    data = document if isinstance(document, bytes) else raw(document)
    return anyio.run(functools.partial(document_load, data, **options))


def refusal(document: dict[str, Any] | bytes, **options: Any) -> str:
    with pytest.raises(DocumentRefused) as refused:
        load(document, **options)
    return str(refused.value)


# --- A real document ------------------------------------------------------------------------------------------


def test_the_gateways_own_openapi_document_loads_with_every_ref_resolved(tmp_path: Path):
    schema = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(schema))
    document = load(schema.read_bytes())
    assert document["openapi"].startswith("3.")
    assert '"$ref"' not in json.dumps(document)
    listed = document["paths"]["/api/v1/agents"]["get"]["responses"]["200"]["content"]["application/json"]
    assert listed["schema"]["items"] == document["components"]["schemas"]["Agent"]


def test_a_yaml_document_reads_like_its_json_with_numeric_status_codes_as_text():
    text = (
        b"openapi: 3.0.3\ninfo: {title: t, version: 2024-01-01}\n"
        b"paths:\n  /a:\n    get:\n      responses:\n        200: {description: ok}\n"
    )
    document = document_parse(text, max_bytes=MB)
    assert document["paths"]["/a"]["get"]["responses"] == {"200": {"description": "ok"}}
    assert document["info"]["version"] == "2024-01-01", "a date stays text, as in JSON"


def test_a_ref_with_a_sibling_description_takes_the_targets_schema_and_its_own_description():
    document = a_document({"Item": {"type": "object", "description": "An item"}})
    document["paths"]["/items"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] = {
        "$ref": "#/components/schemas/Item",
        "description": "The item asked for",
    }
    loaded = load(document)
    answer = loaded["paths"]["/items"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"type": "object", "description": "The item asked for"}


# --- Refused before parsing, or as parsed ---------------------------------------------------------------------


def test_a_50_mb_document_is_refused_by_its_size_before_it_is_parsed():
    huge = b"{" + b" " * (50 * MB - 1)  # never closed: parsing it would fail differently
    assert refusal(huge) == "the document is 52,428,800 bytes; the limit is 5,242,880"


def test_a_yaml_anchor_bomb_is_refused_at_its_first_alias():
    bomb = b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for name, previous in zip("bcdefghi", "abcdefgh", strict=True):
        bomb += f"{name}: &{name} [{','.join([f'*{previous}'] * 9)}]\n".encode()
    assert refusal(bomb) == "YAML aliases are not accepted (anchor bomb guard)"


def test_a_single_alias_is_refused_too():
    text = b"openapi: &v 3.1.0\ninfo: {title: t, version: *v}\npaths: {}\n"
    assert refusal(text) == "YAML aliases are not accepted (anchor bomb guard)"


def test_a_document_whose_root_is_a_list_is_refused():
    assert refusal(b"- openapi\n- 3.1.0\n") == "the document is not a mapping at its root"


def test_a_swagger_2_document_is_refused_for_its_version():
    swagger = {"swagger": "2.0", "info": {"title": "t", "version": "1"}, "paths": {}}
    assert refusal(swagger) == "the document has no 'openapi' field; OpenAPI 3.0.x and 3.1.x are accepted"
    assert refusal(a_document() | {"openapi": "3.2.0"}) == (
        "the document has openapi '3.2.0'; OpenAPI 3.0.x and 3.1.x are accepted"
    )


def test_broken_yaml_and_broken_json_are_refused_as_such():
    assert refusal(b"openapi: [3.1.0\n").startswith("the document is not valid YAML: ")
    assert refusal(b'{"openapi": "3.1.0",}').startswith("the document is not valid JSON: ")


def test_a_document_that_is_not_valid_openapi_is_refused_with_where():
    document = a_document()
    del document["info"]["version"]
    assert refusal(document) == "the document is not valid OpenAPI 3.1.0: 'version' is a required property (at #/info)"


# --- $refs ----------------------------------------------------------------------------------------------------


def test_a_broken_ref_is_refused_naming_it():
    document = a_document(answer={"$ref": "#/components/schemas/Missing"})
    assert refusal(document) == "$ref '#/components/schemas/Missing' points at nothing"


def test_a_recursive_schema_is_refused_naming_the_cycle():
    document = a_document(
        {
            "Node": {"type": "object", "properties": {"parent": {"$ref": "#/components/schemas/Parent"}}},
            "Parent": {"type": "object", "properties": {"child": {"$ref": "#/components/schemas/Node"}}},
        },
        answer={"$ref": "#/components/schemas/Node"},
    )
    assert refusal(document) == (
        "$ref '#/components/schemas/Node' is recursive (#/components/schemas/Node -> #/components/schemas/Parent"
        " -> #/components/schemas/Node); recursive schemas are not accepted"
    )


def test_refs_beyond_the_count_or_depth_limit_are_refused():
    schemas = {"A": {"$ref": "#/components/schemas/B"}, "B": {"$ref": "#/components/schemas/C"}, "C": {}}
    assert refusal(a_document(schemas), limits=DocumentLimits(max_refs=2)) == (
        "the document uses $refs more than 2 times"
    )
    assert refusal(a_document(schemas), limits=DocumentLimits(max_ref_depth=1)) == (
        "$ref '#/components/schemas/C' is nested more than 1 $refs deep"
    )


def test_a_document_that_expands_past_the_node_limit_is_refused():
    schemas = {"Wide": {"type": "object", "properties": {f"p{n}": {"type": "string"} for n in range(50)}}}
    schemas |= {f"Use{n}": {"$ref": "#/components/schemas/Wide"} for n in range(50)}
    assert refusal(a_document(schemas), limits=DocumentLimits(max_nodes=2_000)) == (
        "the document has more than 2,000 values once resolved"
    )


def test_an_external_ref_is_fetched_relative_to_the_document_url():
    fetch = Fetcher({"https://api.example.com/specs/schemas.yaml": {"Item": {"type": "object", "title": "Item"}}})
    loaded = load(a_document(answer={"$ref": "schemas.yaml#/Item"}), document_url=DOCUMENT_URL, fetch=fetch)
    assert loaded["paths"]["/items"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] == {
        "type": "object",
        "title": "Item",
    }
    assert fetch.asked == ["https://api.example.com/specs/schemas.yaml"]


def test_an_external_ref_at_a_loopback_address_is_refused_without_a_fetch():
    fetch = Fetcher()
    document = a_document(answer={"$ref": "http://127.0.0.1:8080/schemas.yaml#/Item"})
    assert refusal(document, fetch=fetch) == (
        "$ref 'http://127.0.0.1:8080/schemas.yaml#/Item' is refused: 127.0.0.1 is not a public address"
    )
    assert fetch.asked == []


def test_an_external_ref_at_a_private_address_is_fetched_for_an_internal_upstream():
    fetch = Fetcher({"http://10.0.0.5/schemas.yaml": {"Item": {"type": "object"}}})
    load(a_document(answer={"$ref": "http://10.0.0.5/schemas.yaml#/Item"}), fetch=fetch, internal=True)
    assert fetch.asked == ["http://10.0.0.5/schemas.yaml"]


def test_a_name_that_resolves_to_a_private_address_at_fetch_time_is_refused():
    fetch = Fetcher(error=EgressRefused("schemas.example.com resolves to 10.0.0.5, which is not a public address"))
    document = a_document(answer={"$ref": "https://schemas.example.com/s.yaml#/Item"})
    assert refusal(document, fetch=fetch) == (
        "$ref 'https://schemas.example.com/s.yaml#/Item' is refused: "
        "schemas.example.com resolves to 10.0.0.5, which is not a public address"
    )


def test_external_refs_that_cannot_or_may_not_be_fetched_are_refused():
    assert refusal(a_document(answer={"$ref": "https://schemas.example.com/s.yaml#/Item"})) == (
        "$ref 'https://schemas.example.com/s.yaml#/Item' points outside the document, and nothing may be fetched here"
    )
    assert refusal(a_document(answer={"$ref": "schemas.yaml#/Item"}), fetch=Fetcher()) == (
        "$ref 'schemas.yaml#/Item' is relative and the document has no URL to resolve it against"
    )
    assert refusal(a_document(answer={"$ref": "file:///etc/passwd"}), fetch=Fetcher()) == (
        "$ref 'file:///etc/passwd' is not an http(s) URL"
    )


def test_external_documents_past_the_count_or_size_limit_are_refused():
    schemas = {"A": {"$ref": "https://s.example.com/a.yaml"}, "B": {"$ref": "https://s.example.com/b.yaml"}}
    fetch = Fetcher({"https://s.example.com/a.yaml": {}, "https://s.example.com/b.yaml": {}})
    limits = DocumentLimits(max_fetches=1)
    assert refusal(a_document(schemas), fetch=fetch, limits=limits) == (
        "the $refs reach more than 1 external documents"
    )
    fetch = Fetcher({"https://s.example.com/a.yaml": b"{}" + b" " * MB, "https://s.example.com/b.yaml": {}})
    assert refusal(a_document(schemas), fetch=fetch, limits=DocumentLimits(max_bytes=MB)) == (
        "the document at https://s.example.com/a.yaml is 1,048,578 bytes; the limit is 1,048,576"
    )


def test_a_ref_in_an_external_document_resolves_against_that_documents_url():
    fetch = Fetcher(
        {
            "https://s.example.com/v1/a.yaml": {"A": {"$ref": "b.yaml#/B"}},
            "https://s.example.com/v1/b.yaml": {"B": {"type": "string"}},
        }
    )
    document = a_document(answer={"$ref": "https://s.example.com/v1/a.yaml#/A"})
    resolved = anyio.run(functools.partial(document_resolve, document, document_url=None, fetch=fetch, internal=False))
    assert resolved["paths"]["/items"]["get"]["responses"]["200"]["content"]["application/json"]["schema"] == {
        "type": "string"
    }


# --- The base URL ---------------------------------------------------------------------------------------------


def test_the_base_url_is_the_first_server_resolved_against_the_document_url_with_variables_at_their_defaults():
    document = a_document() | {"servers": [{"url": "/v{major}", "variables": {"major": {"default": "2"}}}]}
    assert document_base_url(document, document_url=DOCUMENT_URL, internal=False) == "https://api.example.com/v2"


def test_a_server_at_a_private_address_is_refused_unless_the_upstream_is_internal():
    document = a_document() | {"servers": [{"url": "http://169.254.169.254/latest"}]}
    with pytest.raises(DocumentRefused) as refused:
        document_base_url(document, document_url=None, internal=False)
    assert str(refused.value) == (
        "the document's servers[0].url 'http://169.254.169.254/latest' is refused: "
        "169.254.169.254 is not a public address"
    )
    assert document_base_url(document, document_url=None, internal=True) == "http://169.254.169.254/latest"


def test_a_relative_server_without_a_document_url_is_refused():
    document = a_document() | {"servers": [{"url": "/api"}]}
    with pytest.raises(DocumentRefused) as refused:
        document_base_url(document, document_url=None, internal=False)
    assert str(refused.value) == (
        "the document's servers[0].url '/api' is not an absolute http(s) URL "
        "and the document has no URL to resolve it against"
    )
