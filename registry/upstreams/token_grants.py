"""Token requests the executor makes at an upstream's authorization server for a person: an authorization code
exchanged (with its PKCE verifier), a refresh, and a token exchange (RFC 8693). oauthlib builds the requests and
parses the answers; the egress guard stands between them and the network: an authorization server may be on a
private address only if GATEWAY_INTERNAL_AUTH_SERVERS lists its origin (an upstream's metadata must not point the
executor at the inside of its own network)."""

import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2
from django.conf import settings
from oauthlib.oauth2.rfc6749.errors import OAuth2Error
from oauthlib.oauth2.rfc6749.parameters import parse_token_response, prepare_token_request

from registry.upstreams.egress import EgressRefused, guarded_client

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
MAX_ANSWER_BYTES = 64 * 1024


class GrantFailed(Exception):
    """The authorization server refused or could not be reached; the message names no secret."""


@dataclass(frozen=True)
class Grant:
    values: dict[str, str]  # token, and where there is one, refresh_token
    expires_at: float  # epoch seconds; 0: not said


def auth_client(url: str, **kwargs) -> httpx2.AsyncClient:
    """An httpx client for an authorization server at `url`: guarded unless its origin is listed as internal."""
    parts = urlsplit(url)
    internal = f"{parts.scheme}://{parts.netloc}" in settings.GATEWAY_INTERNAL_AUTH_SERVERS
    timeout = httpx2.Timeout(settings.GATEWAY_CONNECT_TIMEOUT)
    return guarded_client(internal=internal, timeout=timeout, **kwargs)


async def _token_request(url: str, client: dict[str, str], grant_type: str, **fields) -> Grant:
    body = prepare_token_request(grant_type, include_client_id=True, client_id=client.get("client_id"), **fields)
    auth = (client["client_id"], client["client_secret"]) if client.get("client_secret") else None
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
    try:
        async with auth_client(url) as http:
            answer = await http.post(url, content=body, headers=headers, auth=auth)
    except EgressRefused as refused:
        raise GrantFailed(f"the authorization server's address is refused: {refused}") from None
    except httpx2.HTTPError as exc:
        raise GrantFailed(f"the authorization server could not be reached: {type(exc).__name__}") from None
    if len(answer.content) > MAX_ANSWER_BYTES:
        raise GrantFailed(f"the authorization server's answer is over {MAX_ANSWER_BYTES} bytes")
    try:
        token = parse_token_response(answer.text)
    except OAuth2Error as refused:
        raise GrantFailed(f"the authorization server refused ({answer.status_code}): {refused.error}") from None
    except ValueError:
        raise GrantFailed(f"the authorization server answered {answer.status_code} without a token") from None
    values = {"token": token["access_token"]}
    if token.get("refresh_token"):
        values["refresh_token"] = token["refresh_token"]
    expires_in = token.get("expires_in")
    return Grant(values, time.time() + float(expires_in) if expires_in else 0.0)


async def code_grant(
    *, token_url: str, client: dict[str, str], code: str, redirect_uri: str, verifier: str, resource: str
) -> Grant:
    return await _token_request(
        token_url,
        client,
        "authorization_code",
        code=code,
        redirect_uri=redirect_uri,
        code_verifier=verifier,
        resource=resource,
    )


async def token_refresh(values: dict[str, str]) -> Grant:
    """A refreshed OAuth credential; `values` as stored: the token, refresh_token, token_url, client_id and
    client_secret (if any), resource."""
    if not values.get("refresh_token"):
        raise GrantFailed("the token ran out and there is no refresh token")
    client = {"client_id": values["client_id"], "client_secret": values.get("client_secret", "")}
    fields = {"refresh_token": values["refresh_token"]}
    if values.get("resource"):
        fields["resource"] = values["resource"]
    return await _token_request(values["token_url"], client, "refresh_token", **fields)


async def token_exchange(*, url: str, client: dict[str, str], subject_token: str, audience: str, scope: str) -> Grant:
    fields = {"subject_token": subject_token, "subject_token_type": ACCESS_TOKEN_TYPE, "audience": audience}
    fields |= {"requested_token_type": ACCESS_TOKEN_TYPE, "resource": audience}
    if scope:
        fields["scope"] = scope
    return await _token_request(url, client, TOKEN_EXCHANGE, **fields)
