"""A REST service behind the pool's client interface. Its operations (from its OpenAPI document, or declared by
hand: registry/rest/) are listed as tools, and each tool call is one HTTP request. The pool and the connection
use only what an MCP client and this share: `protocol_version`, `server_capabilities`, `instructions`,
`list_tools` and `call_tool`; resources and prompts it does not offer, so forwarding them is refused as for an
MCP server that lacks them.

Credentials (the upstream's headers and query, shared or a person's) go only to the service's own origins (its
base URL's and its document's): a redirect to another origin is followed without them, and every connection,
redirects included, passes the egress guard unless the upstream is internal."""

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx2
from django.conf import settings
from mcp import types

from registry.rest.calls import CallRefused, request_of, result_of
from registry.rest.document import DocumentLimits, DocumentRefused, document_base_url, document_load
from registry.rest.operations import Operation, operations_declared, operations_of, tool_of
from registry.upstreams.egress import ADDRESS_REFUSED, EgressRefused

REST_PROTOCOL = "rest"  # what a REST upstream's catalog records as its protocol version
REDIRECTS = frozenset({301, 302, 303, 307, 308})


class CallFailed(Exception):
    """A call that ended without an answer to render: the pool turns it into a failed outcome."""

    def __init__(self, code: str, message: str, detail: str = "", *, validation: bool = False) -> None:
        super().__init__(message)
        self.code, self.message, self.detail, self.validation = code, message, detail or message, validation


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class RestClient:
    protocol_version = REST_PROTOCOL
    instructions = ""
    server_capabilities = types.ServerCapabilities(tools=types.ToolsCapability(list_changed=True))

    def __init__(self, spec: Any, http: httpx2.AsyncClient, heard: Callable[[Any], Awaitable[None]] | None) -> None:
        self._spec = spec
        self._http = http
        self._heard = heard  # the connection's notification handler: told when the document changed
        self._operations: dict[str, Operation] = {}
        self._digest = ""
        self._base = spec.url
        # A tool's name must fit beside the upstream's namespace in an exposed name (registry/naming.py).
        self._max_name = settings.GATEWAY_MAX_TOOL_NAME - len(spec.slug) - len(settings.GATEWAY_TOOL_SEPARATOR)

    async def load(self) -> None:
        """Read the operations (the document fetched again when it lives at a URL); a changed document is
        announced as a changed tool list, so that the catalog is synced again and pins apply."""
        spec = self._spec
        if spec.rest_operations:
            found = operations_declared(spec.rest_operations, max_name_length=self._max_name)
            digest = ""
        else:
            raw = spec.openapi_document.encode() if spec.openapi_document else await self._document_fetch()
            digest = hashlib.sha256(raw).hexdigest()
            if digest == self._digest:
                return
            limits = DocumentLimits(
                max_bytes=settings.GATEWAY_REST_DOCUMENT_MAX_BYTES, max_fetches=settings.GATEWAY_REST_MAX_EXTERNAL_REFS
            )
            where = spec.openapi_url or None
            document = await document_load(
                raw, document_url=where, fetch=self._ref_fetch, internal=spec.internal, limits=limits
            )
            self._base = spec.url or document_base_url(document, document_url=where, internal=spec.internal)
            found = operations_of(document, max_name_length=self._max_name, read_only=spec.read_only, **_select(spec))
        changed = bool(self._digest) and digest != self._digest
        self._operations, self._digest = {op.name: op for op in found}, digest
        if changed and self._heard:
            await self._heard(types.ToolListChangedNotification())

    async def list_tools(self, cursor: str | None = None, **_: Any) -> types.ListToolsResult:
        if cursor is None and self._spec.openapi_url:
            await self.load()
        tools = [types.Tool.model_validate(tool_of(op)) for op in self._operations.values()]
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None, **_: Any) -> types.CallToolResult:
        operation = self._operations.get(name)
        if operation is None:
            raise CallFailed("UPSTREAM_ERROR", f"The service has no operation {name!r}.")
        try:
            method, url, headers, body = request_of(operation, arguments or {}, base_url=self._base)
        except CallRefused as refused:
            raise CallFailed(
                "UPSTREAM_ERROR", f"The call's arguments were refused: {refused}", validation=True
            ) from refused
        try:
            status, content_type, data = await self._send(method, url, headers, body)
        except EgressRefused as refused:
            raise CallFailed("UPSTREAM_ADDRESS_REFUSED", ADDRESS_REFUSED, str(refused)) from refused
        except httpx2.HTTPError as exc:
            raise CallFailed("UPSTREAM_UNAVAILABLE", "The service could not be reached. Try later.", repr(exc)) from exc
        cap = settings.GATEWAY_REST_RESPONSE_MAX_BYTES
        return types.CallToolResult.model_validate(result_of(operation, status, content_type, data, max_bytes=cap))

    async def _document_fetch(self) -> bytes:
        return await self._ref_fetch(self._spec.openapi_url)

    async def _ref_fetch(self, url: str) -> bytes:
        """A document (the service's, or one its $refs name), refused past the size limit without reading on."""
        cap = settings.GATEWAY_REST_DOCUMENT_MAX_BYTES
        status, _, data = await self._send("GET", url, {}, None, cap)
        if not 200 <= status < 300:
            raise DocumentRefused(f"fetching {url} answered HTTP {status}")
        if len(data) > cap:
            raise DocumentRefused(f"{url} is larger than the limit of {cap:,} bytes")
        return data

    def _credentials(self, url: str) -> tuple[dict[str, str], dict[str, str]]:
        """The upstream's headers and query for a request to `url`: only to the service's own origins."""
        own = {_origin(u) for u in (self._base, self._spec.openapi_url) if u}
        return (self._spec.headers, self._spec.query) if _origin(url) in own else ({}, {})

    async def _send(
        self, method: str, url: str, headers: dict[str, str], body: Any, cap: int | None = None
    ) -> tuple[int, str, bytes]:
        """One request, following up to GATEWAY_REST_MAX_REDIRECTS redirects; the answer's status, content type
        and body, read up to `cap` bytes (+1, so that the renderer can say it was cut)."""
        cap = cap or settings.GATEWAY_REST_RESPONSE_MAX_BYTES
        for _ in range(settings.GATEWAY_REST_MAX_REDIRECTS + 1):
            sent_headers, query = self._credentials(url)
            request = self._http.build_request(
                method, url, headers=headers | sent_headers, params=query or None, json=body
            )
            response = await self._http.send(request, stream=True)
            try:
                if response.status_code in REDIRECTS and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    if response.status_code == 303 or response.status_code in (301, 302) and method == "POST":
                        method, body = "GET", None
                    continue
                return response.status_code, response.headers.get("content-type", ""), await _read(response, cap)
            finally:
                await response.aclose()
        raise CallFailed(
            "UPSTREAM_INVALID_RESPONSE",
            f"The service redirected more than {settings.GATEWAY_REST_MAX_REDIRECTS} times.",
        )


async def _read(response: httpx2.Response, cap: int) -> bytes:
    """The body up to `cap` + 1 bytes: enough to know it was longer, never the whole of a huge one."""
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) > cap:
            break
    return bytes(data[: cap + 1])


def _select(spec: Any) -> dict[str, tuple[str, ...]]:
    select = spec.rest_select or {}
    return {
        "include_tags": tuple(select.get("include_tags", ())),
        "exclude_tags": tuple(select.get("exclude_tags", ())),
        "include_ids": tuple(select.get("include", ())),
        "exclude_ids": tuple(select.get("exclude", ())),
    }
