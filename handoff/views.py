"""The gateway's HTTP endpoints beside /mcp: redeeming carried state from the claim-check store (for specialist
servers), and the Protected Resource Metadata that tells an OAuth client where to sign in (RFC 9728)."""

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from gateway_project.lib.signing import TOKEN_HEADER, DelegationError, expired, token_verify
from handoff.clearance import django_refusal
from handoff.mcp.caller import authorization_servers, public_base, required_scopes, resource_uri
from handoff.protocol.claim_checks import claim_store
from handoff.snapshot import snapshot
from registry.upstreams.delegation import key_ring


@csrf_exempt  # no cookies: the delegation token authenticates the request
@require_POST
async def claim_redeem(request: HttpRequest) -> HttpResponse:
    """The state a valid token's `state_ref` names, once; a second redemption, an expired token or a state
    that is gone all get EXPIRED_DELEGATION_TOKEN."""
    try:
        claims = token_verify(key_ring(), request.headers.get(TOKEN_HEADER, ""), audience=None)
        if not isinstance(claims.get("state_ref"), str):
            raise expired("This delegation carries no state to redeem.")
        held = await claim_store().redeem(claims["state_ref"])
        if held is None or held.get("tid") != claims["tid"]:
            raise expired("The carried state was already redeemed or has expired; ask for a new handoff.")
    except DelegationError as error:
        return django_refusal(error)
    return JsonResponse({"state": held["state"]})


@require_GET
async def protected_resource(request: HttpRequest, server: str | None = None) -> HttpResponse:
    """Where to get a token for /mcp, at both paths the MCP authorization spec names (the root and the one
    suffixed with the resource's path), or for a virtual server (its own resource, and so its own audience); 404
    while no issuer is configured, or for a virtual server there is not. Readable from any origin: browser
    clients such as the MCP Inspector fetch it."""
    snap = await snapshot.get()
    if not snap.signs_in:
        return JsonResponse({"error": "not_found", "error_description": "No sign-in is configured"}, status=404)
    virtual = snap.servers.get(server) if server is not None else None
    if server is not None and virtual is None:
        return JsonResponse({"error": "not_found", "error_description": "No such virtual server"}, status=404)
    metadata = {
        "resource": f"{public_base(request.scope)}/mcp/s/{server}" if virtual else resource_uri(request.scope),
        "authorization_servers": authorization_servers(request.scope, snap),
        "bearer_methods_supported": ["header"],
        "resource_name": (virtual.title or virtual.name) if virtual else settings.GATEWAY_NAME,
    }
    if scopes := required_scopes(snap):
        metadata["scopes_supported"] = scopes
    response = JsonResponse(metadata)
    response["Access-Control-Allow-Origin"] = "*"
    return response
