"""An OpenAPI 3.0/3.1 document, read and checked before anything is registered: parsed from JSON or YAML within a
byte limit (YAML aliases refused, so an anchor bomb never expands), every `$ref` resolved into one
self-contained document within limits (external documents fetched through the caller's fetcher, each URL
checked by the egress guard first), validated with openapi-spec-validator, and its base URL taken from
`servers`. Every refusal is a DocumentRefused whose message tells an operator what to fix."""

import json
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import yaml

from registry.upstreams.egress import EgressRefused, url_problem

# openapi-spec-validator picks jsonschema-rs when it is installed (a test dependency brings it), and its messages
# differ: the gateway keeps to the pure-Python backend its own requirements install, so refusals read the same
# wherever it runs. The library reads this setting from the environment at each validation.
os.environ.setdefault("OPENAPI_SPEC_VALIDATOR_SCHEMA_VALIDATOR_BACKEND", "jsonschema")

Fetch = Callable[[str], Awaitable[bytes]]
VERSION = re.compile(r"3\.([01])\.\d+")
SERVER_VARIABLE = re.compile(r"\{([^{}]*)\}")
MESSAGE_CHARS = 300


class DocumentRefused(Exception):
    """A document or a set of hand-declared operations that is not registered; the message says why."""

    code = "rest_document_refused"


@dataclass(frozen=True)
class DocumentLimits:
    max_bytes: int = 5 * 1024 * 1024  # the document, and each external document
    max_fetches: int = 20  # external documents
    max_refs: int = 10_000  # $refs followed, each use counted: a schema used 100 times counts 100
    max_ref_depth: int = 32  # $refs followed inside one another
    max_nodes: int = 2_000_000  # values in the resolved document: shared schemas expand, and this bounds it


async def document_load(
    raw: bytes,
    *,
    document_url: str | None,
    fetch: Fetch | None,
    internal: bool,
    limits: DocumentLimits = DocumentLimits(),  # noqa: B008 (frozen)
) -> dict[str, Any]:
    """The document parsed, resolved and validated: what operations_of reads. Raises DocumentRefused."""
    document = document_parse(raw, max_bytes=limits.max_bytes)
    resolved = await document_resolve(
        document, document_url=document_url, fetch=fetch, internal=internal, limits=limits
    )
    document_validate(resolved)
    return resolved


# --- Parsing --------------------------------------------------------------------------------------------------


class _Loader(yaml.CSafeLoader):
    """PyYAML's safe loader (libyaml) that refuses aliases. An alias hands the constructor a node it has built
    before; refusing the second visit refuses every alias, before a "billion laughs" expands anywhere."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node in self.constructed_objects or node in self.recursive_objects:
            raise DocumentRefused("YAML aliases are not accepted (anchor bomb guard)")
        return super().construct_object(node, deep)


# Dates stay text, as they would be in JSON.
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_str)


def document_parse(raw: bytes, *, max_bytes: int) -> dict[str, Any]:
    """An OpenAPI 3.0.x or 3.1.x document from JSON or YAML bytes, refused by size before it is parsed."""
    document = _parsed(raw, max_bytes=max_bytes, what="the document")
    version = document.get("openapi")
    if not isinstance(version, str) or not VERSION.fullmatch(version):
        found = "no 'openapi' field" if version is None else f"openapi {version!r}"
        raise DocumentRefused(f"the document has {found}; OpenAPI 3.0.x and 3.1.x are accepted")
    return document


def _parsed(raw: bytes, *, max_bytes: int, what: str) -> dict[str, Any]:
    if len(raw) > max_bytes:
        raise DocumentRefused(f"{what} is {len(raw):,} bytes; the limit is {max_bytes:,}")
    value = _loaded(raw, what)
    if not isinstance(value, dict):
        raise DocumentRefused(f"{what} is not a mapping at its root")
    return value


def _loaded(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw) if raw.lstrip()[:1] in (b"{", b"[") else _yaml_loaded(raw)
    except RecursionError:
        raise DocumentRefused(f"{what} nests too deeply") from None
    except yaml.YAMLError as exc:
        raise DocumentRefused(f"{what} is not valid YAML: {_short(str(exc))}") from None
    except TypeError:
        raise DocumentRefused(f"{what} has a YAML mapping key that is not a scalar") from None
    except ValueError as exc:
        raise DocumentRefused(f"{what} is not valid JSON: {_short(str(exc))}") from None


def _yaml_loaded(raw: bytes) -> Any:
    # Through JSON and back: keys become strings (`200:` is an int in YAML) and the tree is plain JSON data.
    return json.loads(json.dumps(yaml.load(raw, Loader=_Loader), default=str))


def _short(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else f"{text[:MESSAGE_CHARS]}…"


# --- $ref resolution -----------------------------------------------------------------------------------------


async def document_resolve(
    document: dict[str, Any],
    *,
    document_url: str | None,
    fetch: Fetch | None,
    internal: bool,
    limits: DocumentLimits = DocumentLimits(),  # noqa: B008 (frozen)
) -> dict[str, Any]:
    """The document with every `$ref` replaced by what it points at. A recursive `$ref`, a broken one, one
    outside the limits or at a refused address is refused. External documents come through `fetch`."""
    base = _base(document_url)
    documents = await _documents(document, base=base, fetch=fetch, internal=internal, limits=limits)
    try:
        return _Resolver(documents, base=base, limits=limits).value(document, base, ())
    except RecursionError:
        raise DocumentRefused("the document nests too deeply once its $refs are resolved") from None


def _base(document_url: str | None) -> str:
    return urldefrag(document_url).url if document_url else ""


async def _documents(
    document: dict[str, Any], *, base: str, fetch: Fetch | None, internal: bool, limits: DocumentLimits
) -> dict[str, dict[str, Any]]:
    """The document and every external document its `$ref`s reach, by URL ("" for a document without one)."""
    documents = {base: document}
    pending = [(document, base)]
    while pending:
        current, url = pending.pop()
        for ref in _refs(current):
            target, _ = _target(ref, url)
            if target not in documents:
                if len(documents) > limits.max_fetches:
                    raise DocumentRefused(f"the $refs reach more than {limits.max_fetches} external documents")
                documents[target] = await _external(target, ref, fetch=fetch, internal=internal, limits=limits)
                pending.append((documents[target], target))
    return documents


def _refs(node: Any) -> list[str]:
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            if isinstance(current.get("$ref"), str):
                found.append(current["$ref"])
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)
    return found


def _target(ref: str, base: str) -> tuple[str, str]:
    """(the URL of the document a `$ref` points into, the JSON pointer in it)."""
    url, fragment = urldefrag(urljoin(base, ref) if base else ref)
    if url != base and urlsplit(url).scheme not in ("http", "https"):
        if not base and not urlsplit(url).scheme:
            raise DocumentRefused(f"$ref {ref!r} is relative and the document has no URL to resolve it against")
        raise DocumentRefused(f"$ref {ref!r} is not an http(s) URL")
    return url, unquote(fragment)


async def _external(
    url: str, ref: str, *, fetch: Fetch | None, internal: bool, limits: DocumentLimits
) -> dict[str, Any]:
    if fetch is None:
        raise DocumentRefused(f"$ref {ref!r} points outside the document, and nothing may be fetched here")
    if not internal and (problem := url_problem(url)):
        raise DocumentRefused(f"$ref {ref!r} is refused: {problem}")
    try:
        raw = await fetch(url)
    except EgressRefused as exc:  # what the name resolved to when fetched (the guard in the fetcher)
        raise DocumentRefused(f"$ref {ref!r} is refused: {exc}") from None
    return _parsed(raw, max_bytes=limits.max_bytes, what=f"the document at {url}")


class _Resolver:
    """Copies a document, replacing each `$ref` by its target. Targets are expanded afresh at every use (no
    shared objects in the result), so the counts bound the size of what comes out."""

    def __init__(self, documents: dict[str, dict[str, Any]], *, base: str, limits: DocumentLimits) -> None:
        self.documents, self.base, self.limits = documents, base, limits
        self.refs = self.nodes = 0

    def value(self, node: Any, base: str, chain: tuple[str, ...]) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise DocumentRefused(f"the document has more than {self.limits.max_nodes:,} values once resolved")
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                return self.followed(node, base, chain)
            return {key: self.value(item, base, chain) for key, item in node.items()}
        if isinstance(node, list):
            return [self.value(item, base, chain) for item in node]
        return node

    def followed(self, node: dict[str, Any], base: str, chain: tuple[str, ...]) -> Any:
        ref = node["$ref"]
        url, pointer = _target(ref, base)
        key = f"{url}#{pointer}" if url != self.base else f"#{pointer}"
        self.check(ref, key, chain)
        target = self.value(_pointed(self.documents[url], pointer, ref), url, (*chain, key))
        # OpenAPI 3.1 lets a $ref carry siblings (a summary or description that overrides the target's).
        siblings = {name: self.value(item, base, chain) for name, item in node.items() if name != "$ref"}
        return {**target, **siblings} if siblings and isinstance(target, dict) else target

    def check(self, ref: str, key: str, chain: tuple[str, ...]) -> None:
        if key in chain:
            cycle = " -> ".join((*chain[chain.index(key) :], key))
            raise DocumentRefused(f"$ref {ref!r} is recursive ({cycle}); recursive schemas are not accepted")
        if len(chain) >= self.limits.max_ref_depth:
            raise DocumentRefused(f"$ref {ref!r} is nested more than {self.limits.max_ref_depth} $refs deep")
        self.refs += 1
        if self.refs > self.limits.max_refs:
            raise DocumentRefused(f"the document uses $refs more than {self.limits.max_refs:,} times")


def _pointed(document: dict[str, Any], pointer: str, ref: str) -> Any:
    if pointer and not pointer.startswith("/"):
        raise DocumentRefused(f"$ref {ref!r} has a fragment that is not a JSON pointer")
    node: Any = document
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise DocumentRefused(f"$ref {ref!r} points at nothing")
    return node


# --- Validation and the base URL ------------------------------------------------------------------------------


def document_validate(document: dict[str, Any]) -> None:
    """Refuses a document that is not valid OpenAPI. Run it on the resolved document: with no resolver handlers,
    openapi-spec-validator can never fetch a URL itself."""
    # Imported by the first validation, not with the REST upstreams' calls that every process loads: the validator
    # and its jsonschema-path (requests, pydantic-settings) take 0.1 s that a start serving no new document never needs.
    from jsonschema_path import SchemaPath
    from openapi_spec_validator import OpenAPIV30SpecValidator, OpenAPIV31SpecValidator

    version = document["openapi"]
    minor = VERSION.fullmatch(version).group(1)  # type: ignore[union-attr] (document_parse)
    validator = OpenAPIV31SpecValidator if minor == "1" else OpenAPIV30SpecValidator
    error = next(validator(SchemaPath.from_dict(document, handlers={})).iter_errors(), None)
    if error is not None:
        where = "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in error.absolute_path)
        said = error.message.splitlines()[0]  # the first line says what is wrong (a backend may quote schemas after)
        raise DocumentRefused(f"the document is not valid OpenAPI {version}: {_short(said)} (at #{where})")


def document_base_url(document: dict[str, Any], *, document_url: str | None, internal: bool) -> str:
    """The URL the operations' paths are appended to: `servers[0].url` with its variables at their defaults,
    resolved against the document's URL, and refused at a private address unless the upstream is internal."""
    servers = document.get("servers") or [{"url": "/"}]
    written = _server_url(servers[0])
    url = urljoin(document_url, written) if document_url else written
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        without = "" if document_url else " and the document has no URL to resolve it against"
        raise DocumentRefused(f"the document's servers[0].url {written!r} is not an absolute http(s) URL{without}")
    if not internal and (problem := url_problem(url)):
        raise DocumentRefused(f"the document's servers[0].url {url!r} is refused: {problem}")
    return url


def _server_url(server: dict[str, Any]) -> str:
    variables = server.get("variables") or {}

    def default(match: re.Match[str]) -> str:
        if match[1] not in variables:
            raise DocumentRefused(f"the document's servers[0].url uses {{{match[1]}}}, which has no variable")
        return str(variables[match[1]].get("default", ""))

    return SERVER_VARIABLE.sub(default, str(server.get("url", "/")))
