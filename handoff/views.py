"""The gateway's one endpoint for specialist servers: redeeming carried state from the claim-check store."""

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from gateway_project.lib.signing import TOKEN_HEADER, DelegationError, expired, token_verify
from handoff.clearance import django_refusal
from handoff.protocol.claim_checks import claim_store
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
