"""An upstream's own OAuth sign-in for one person (the MCP authorization spec's code flow with PKCE), executor side.

`oauth_begin` finds the upstream's authorization server as an MCP client would (an unauthenticated request, its
401 naming the Protected Resource Metadata, RFC 9728; that metadata's first authorization server; its metadata,
RFC 8414 then OpenID discovery), takes the gateway's client there (the administrator's pre-registered one, else a
Client ID Metadata Document, else Dynamic Client Registration, RFC 7591) and makes the PKCE pair. What the
callback needs comes back sealed (`material`): the web process stores it and cannot open it, so it never holds
the verifier or a client secret. `oauth_finish` opens it, exchanges the code and stores the person's credential.

Every authorization-server URL, those the upstream's metadata names included, is reached through
token_grants.auth_client (the egress guard, unless GATEWAY_INTERNAL_AUTH_SERVERS lists its origin); redirects
are not followed, answers are bounded in size, and each step in time.
"""

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urljoin, urlsplit

import anyio
import httpx2
from channels.db import database_sync_to_async
from django.conf import settings
from mcp.client.auth.oauth2 import PKCEParameters
from mcp.client.auth.utils import (
    build_oauth_authorization_server_metadata_discovery_urls,
    build_protected_resource_metadata_discovery_urls,
    extract_resource_metadata_from_www_auth,
    extract_scope_from_www_auth,
    get_client_metadata_scopes,
    is_valid_client_metadata_url,
    issuers_match,
    should_use_client_metadata_url,
)
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthMetadata, ProtectedResourceMetadata
from mcp.shared.auth_utils import check_resource_allowed, resource_url_from_server_url
from pydantic import ValidationError

from registry.credentials import CredentialError, credential_open, credential_seal, credentials_open
from registry.models import PersonalCredential, Upstream
from registry.personal import personal_connect
from registry.upstreams.egress import EgressRefused, guarded_client
from registry.upstreams.outcome import Outcome, failure
from registry.upstreams.token_grants import GrantFailed, auth_client, code_grant

logger = logging.getLogger(__name__)

UPSTREAM_OAUTH_FAILED = "UPSTREAM_OAUTH_FAILED"  # the sign-in could not begin or finish; the message says why
AUTH_SERVER_REFUSED = "AUTH_SERVER_REFUSED"  # the authorization server is on an address the gateway does not reach
MAX_ANSWER_BYTES = 64 * 1024
GRANT_TYPES = ["authorization_code", "refresh_token"]
CLIENT_DOCUMENT = "../connect-client/"  # the gateway's Client ID Metadata Document, beside the callback (urls.py)
MATERIAL = "switchboard upstream sign-in"  # what the sealed material and code are bound to, with the upstream


def oauth_seconds() -> float:
    """The longest a begin or a finish may take: every request is bounded too, but a slow answer per step adds up."""
    return 2 * settings.GATEWAY_CONNECT_TIMEOUT


def material_name(upstream_id: int) -> str:
    return f"{MATERIAL}:{upstream_id}"


def code_name(upstream_id: int) -> str:
    """What the web process seals an authorization code with, for this upstream's executor only."""
    return f"{MATERIAL} code:{upstream_id}"


def client_document_url(redirect_uri: str) -> str:
    return urljoin(redirect_uri, CLIENT_DOCUMENT)


def client_document(redirect_uri: str) -> dict:
    """The gateway's Client ID Metadata Document: a public client (PKCE, no secret), its URL its client_id."""
    return {
        "client_id": client_document_url(redirect_uri),
        "client_name": f"Switchboard at {urlsplit(redirect_uri).netloc}",
        "redirect_uris": [redirect_uri],
        "grant_types": GRANT_TYPES,
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
        "application_type": "web",
    }


class SignInFailed(Exception):
    """Why a sign-in cannot go on: a code, a message for the person, the detail for the log (no secret in any)."""

    def __init__(self, code: str, message: str, detail: str = "") -> None:
        super().__init__(detail or message)
        self.code, self.message, self.detail = code, message, detail or message


@dataclass(frozen=True)
class Found:
    """What discovery found: the resource to ask a token for, the authorization server, and the scope."""

    resource: str
    issuer: str
    metadata: OAuthMetadata
    scope: str | None


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _timeout() -> httpx2.Timeout:
    return httpx2.Timeout(settings.GATEWAY_CONNECT_TIMEOUT)


def _client_for(upstream: Upstream, url: str, resource_server: bool) -> httpx2.AsyncClient:
    """The upstream's metadata on its own origin is reached as the upstream is; anything else as an authorization
    server is (GATEWAY_INTERNAL_AUTH_SERVERS), whatever origin it shares."""
    if resource_server and _origin(url) == _origin(upstream.url):
        return guarded_client(internal=upstream.internal, timeout=_timeout())
    return auth_client(url)


async def _read(http: httpx2.AsyncClient, method: str, url: str, **kwargs) -> tuple[httpx2.Response, bytes]:
    """An answer and its body, refused past MAX_ANSWER_BYTES without reading the rest."""
    async with http.stream(method, url, **kwargs) as answer:
        body = bytearray()
        async for chunk in answer.aiter_bytes():
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                raise SignInFailed(UPSTREAM_OAUTH_FAILED, f"{url} answered with over {MAX_ANSWER_BYTES} bytes.")
    return answer, bytes(body)


async def _fetch(
    upstream: Upstream, method: str, url: str, resource_server: bool = False, **kwargs
) -> tuple[httpx2.Response, bytes]:
    """One request of the sign-in, with the egress guard's refusal and network failures said plainly."""
    try:
        async with _client_for(upstream, url, resource_server) as http:
            return await _read(http, method, url, **kwargs)
    except EgressRefused as refused:
        origin = _origin(url)
        message = (
            f"{upstream.slug}'s authorization server {origin} is on an address this gateway does not reach "
            f"({refused}). If it is your organisation's own, an administrator can list {origin} in "
            "GATEWAY_INTERNAL_AUTH_SERVERS."
        )
        raise SignInFailed(AUTH_SERVER_REFUSED, message) from None
    except httpx2.HTTPError as exc:
        message = f"{_origin(url)} could not be reached while signing in to {upstream.slug}. Try again later."
        raise SignInFailed(UPSTREAM_OAUTH_FAILED, message, f"{method} {url}: {type(exc).__name__}") from None


async def _challenge(upstream: Upstream) -> httpx2.Response:
    """The upstream's answer to a request without a token: a 401 naming its metadata (body unread)."""
    initialize = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "switchboard"}}
    headers = {"Accept": "application/json, text/event-stream"}
    try:
        async with guarded_client(internal=upstream.internal, timeout=_timeout()) as http:
            if upstream.transport == Upstream.Transport.SSE:
                async with http.stream("GET", upstream.url, headers=headers) as answer:
                    return answer
            body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": initialize}
            async with http.stream("POST", upstream.url, json=body, headers=headers) as answer:
                return answer
    except (EgressRefused, httpx2.HTTPError) as exc:
        message = f"{upstream.slug} could not be reached to find where to sign in. Try again later."
        raise SignInFailed(UPSTREAM_OAUTH_FAILED, message, f"{upstream.url}: {type(exc).__name__}: {exc}") from None


async def _resource_metadata(upstream: Upstream, challenge: httpx2.Response) -> ProtectedResourceMetadata:
    where = extract_resource_metadata_from_www_auth(challenge)
    for url in build_protected_resource_metadata_discovery_urls(where, upstream.url):
        answer, body = await _fetch(upstream, "GET", url, resource_server=True)
        if answer.status_code == 200:
            try:
                return ProtectedResourceMetadata.model_validate_json(body)
            except ValidationError:
                logger.warning("upstream %s: %s is not protected resource metadata", upstream.slug, url)
    message = f"{upstream.slug} does not say where to sign in (no OAuth protected resource metadata): it cannot be "
    raise SignInFailed(UPSTREAM_OAUTH_FAILED, message + "connected this way. Ask its administrators.")


async def _server_metadata(upstream: Upstream, issuer: str) -> OAuthMetadata:
    for url in build_oauth_authorization_server_metadata_discovery_urls(issuer, upstream.url):
        answer, body = await _fetch(upstream, "GET", url)
        if answer.status_code >= 500:
            break
        if answer.status_code != 200:
            continue
        try:
            metadata = OAuthMetadata.model_validate_json(body)
        except ValidationError:
            continue
        if not issuers_match(str(metadata.issuer), issuer):  # RFC 8414 3.3: the metadata of another server
            message = f"{upstream.slug}'s authorization server {issuer} published metadata for another issuer."
            raise SignInFailed(UPSTREAM_OAUTH_FAILED, message, f"{url} names {metadata.issuer}")
        return metadata
    message = f"{upstream.slug}'s authorization server {issuer} publishes no metadata (RFC 8414 or OpenID discovery)."
    raise SignInFailed(UPSTREAM_OAUTH_FAILED, message)


async def discover(upstream: Upstream) -> Found:
    """Where and for what the person signs in, as the MCP authorization spec has a client find it."""
    challenge = await _challenge(upstream)
    protected = await _resource_metadata(upstream, challenge)
    wanted, named = resource_url_from_server_url(upstream.url), str(protected.resource)
    if not check_resource_allowed(requested_resource=wanted, configured_resource=named):
        message = f"{upstream.slug}'s metadata describes another resource ({named}), so it is not to be trusted."
        raise SignInFailed(UPSTREAM_OAUTH_FAILED, message)
    issuer = str(protected.authorization_servers[0])
    metadata = await _server_metadata(upstream, issuer)
    if "S256" not in (metadata.code_challenge_methods_supported or []):
        message = f"{upstream.slug}'s authorization server does not support PKCE (S256), which a sign-in needs."
        raise SignInFailed(UPSTREAM_OAUTH_FAILED, message)
    if upstream.person_scope:
        scope = upstream.person_scope
    else:
        offered = extract_scope_from_www_auth(challenge) if challenge.status_code in (401, 403) else None
        scope = get_client_metadata_scopes(offered, protected, metadata, GRANT_TYPES)
    return Found(resource=named, issuer=issuer, metadata=metadata, scope=scope)


def _auth_method(metadata: OAuthMetadata) -> str:
    """A confidential client where the server allows one (its secret sealed like a token), else a public one."""
    methods = metadata.token_endpoint_auth_methods_supported
    if methods is None or "client_secret_basic" in methods:  # RFC 8414: absent means client_secret_basic
        return "client_secret_basic"
    if "none" in methods:
        return "none"
    raise SignInFailed(
        UPSTREAM_OAUTH_FAILED,
        "The upstream's authorization server takes no client authentication this gateway uses: an administrator "
        "can register the gateway there and enter its client.",
        f"token_endpoint_auth_methods_supported: {methods}",
    )


async def _registered(upstream: Upstream, found: Found, redirect_uri: str) -> dict[str, str]:
    endpoint = found.metadata.registration_endpoint
    if endpoint is None:
        message = (
            f"{upstream.slug}'s authorization server offers no client registration: an administrator can register "
            "the gateway there and enter its client id and secret on the upstream."
        )
        raise SignInFailed(UPSTREAM_OAUTH_FAILED, message)
    request = OAuthClientMetadata(
        redirect_uris=[redirect_uri],
        client_name=client_document(redirect_uri)["client_name"],
        grant_types=GRANT_TYPES,
        response_types=["code"],
        token_endpoint_auth_method=_auth_method(found.metadata),
        scope=found.scope,
        application_type="web",
    )
    body = request.model_dump(by_alias=True, mode="json", exclude_none=True)
    answer, content = await _fetch(upstream, "POST", str(endpoint), json=body)
    refused = f"{upstream.slug}'s authorization server refused to register the gateway as a client."
    if answer.status_code not in (200, 201):
        raise SignInFailed(UPSTREAM_OAUTH_FAILED, refused, f"registration answered {answer.status_code}")
    try:
        client = OAuthClientInformationFull.model_validate_json(content)
    except ValidationError:
        raise SignInFailed(UPSTREAM_OAUTH_FAILED, refused, "registration answered without a client") from None
    return {"client_id": client.client_id, "client_secret": client.client_secret or ""}


async def _client(upstream: Upstream, found: Found, redirect_uri: str) -> dict[str, str]:
    """The gateway's client at the authorization server: pre-registered, a metadata document, or registered now."""
    if upstream.person_client:
        opened = credentials_open(upstream.person_client)
        return {"client_id": opened.get("client_id", ""), "client_secret": opened.get("client_secret", "")}
    document = client_document_url(redirect_uri)
    if is_valid_client_metadata_url(document) and should_use_client_metadata_url(found.metadata, document):
        return {"client_id": document, "client_secret": ""}
    return await _registered(upstream, found, redirect_uri)


def _upstream(upstream_id: int) -> Upstream | None:
    found = Upstream.objects.filter(pk=upstream_id, per_person=True).first()
    return found if found and found.person_connect == Upstream.PersonConnect.OAUTH else None


_upstream_read = database_sync_to_async(_upstream, thread_sensitive=False)


def _not_oauth() -> Outcome:
    return failure(UPSTREAM_OAUTH_FAILED, "This service is not connected by signing in there.")


async def _begin(upstream: Upstream, redirect_uri: str) -> dict:
    found = await discover(upstream)
    client = await _client(upstream, found, redirect_uri)
    pkce = PKCEParameters.generate()
    inner = client | {"token_url": str(found.metadata.token_endpoint), "resource": found.resource}
    inner |= {"verifier": pkce.code_verifier, "redirect_uri": redirect_uri}
    material = {
        "sealed": credential_seal(json.dumps(inner), name=material_name(upstream.id)),
        "issuer": found.issuer,  # in clear: the callback checks the answer's `iss` against it (RFC 9207)
        "iss_required": bool(found.metadata.authorization_response_iss_parameter_supported),
    }
    scope = found.scope or ""
    logger.info("upstream %s: sign-in begun at %s as client %s", upstream.slug, found.issuer, client["client_id"])
    return {
        "authorization_endpoint": str(found.metadata.authorization_endpoint),
        "client_id": client["client_id"],
        "code_challenge": pkce.code_challenge,
        "scope": scope,
        "resource": found.resource,
        # OpenID Connect asks for consent to be prompted when offline access (a refresh token) is asked for.
        "prompt": "consent" if "offline_access" in scope.split() else "",
        "material": material,
    }


async def oauth_begin(upstream_id: int, redirect_uri: str) -> Outcome:
    """Where to send the person to sign in, and the sealed material the callback needs (Outcome.result)."""
    upstream = await _upstream_read(upstream_id)
    if upstream is None:
        return _not_oauth()
    try:
        with anyio.fail_after(oauth_seconds()):
            return {"ok": True, "result": await _begin(upstream, redirect_uri)}
    except SignInFailed as failed:
        logger.warning("upstream %s: sign-in could not begin: %s", upstream.slug, failed.detail)
        return failure(failed.code, failed.message, failed.detail)
    except TimeoutError:
        message = f"{upstream.slug}'s authorization server took too long to answer. Try again later."
        return failure(UPSTREAM_OAUTH_FAILED, message, f"no discovery within {oauth_seconds():g}s")


def _opened(upstream_id: int, material: dict, sealed_code: str) -> tuple[dict, str]:
    inner = json.loads(credential_open(material["sealed"], name=material_name(upstream_id)))
    return inner, credential_open(sealed_code, name=code_name(upstream_id))


async def oauth_finish(
    upstream_id: int,
    material: dict,
    sealed_code: str,
    redirect_uri: str,
    person_issuer: str,
    person_subject: str,
    person_name: str,
) -> Outcome:
    """The code exchanged and the person's credential stored; the result names it and its expiry, never a token."""
    upstream = await _upstream_read(upstream_id)
    if upstream is None:
        return _not_oauth()
    try:
        inner, code = _opened(upstream_id, material, sealed_code)
    except (CredentialError, KeyError, TypeError, ValueError) as exc:
        logger.warning("upstream %s: sign-in material does not open: %s", upstream.slug, exc)
        return failure(UPSTREAM_OAUTH_FAILED, "This sign-in cannot be finished here: start again.", str(exc))
    if inner["redirect_uri"] != redirect_uri:
        return failure(UPSTREAM_OAUTH_FAILED, "This sign-in came back to another address: start again.")
    client = {"client_id": inner["client_id"], "client_secret": inner["client_secret"]}
    try:
        with anyio.fail_after(oauth_seconds()):
            grant = await code_grant(
                token_url=inner["token_url"],
                client=client,
                code=code,
                redirect_uri=redirect_uri,
                verifier=inner["verifier"],
                resource=inner["resource"],
            )
    except (GrantFailed, TimeoutError) as failed:
        logger.warning("upstream %s: the code exchange failed: %s", upstream.slug, failed or "timed out")
        message = f"{upstream.slug}'s authorization server gave no token, so nothing was connected: start again."
        return failure(UPSTREAM_OAUTH_FAILED, message, str(failed) or "timed out")
    values = grant.values | {"token_url": inner["token_url"], "resource": inner["resource"]}
    values |= {name: value for name, value in client.items() if value}
    expires_at = datetime.fromtimestamp(grant.expires_at, UTC) if grant.expires_at else None
    credential = await database_sync_to_async(personal_connect, thread_sensitive=False)(
        upstream=upstream,
        issuer=person_issuer,
        subject=person_subject,
        name=person_name,
        kind=PersonalCredential.Kind.OAUTH,
        values=values,
        expires_at=expires_at,
    )
    logger.info("upstream %s: personal credential %s connected by signing in", upstream.slug, credential.pk)
    return {
        "ok": True,
        "result": {"credential": credential.pk, "expires_at": expires_at.isoformat() if expires_at else ""},
    }
