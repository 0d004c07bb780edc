"""A call to a per-person upstream at the gateway's door: the caller's credential, as a reference the executor
resolves (registry/personal.py CredentialRef), or the refusal that tells the person to connect and where."""

from channels.db import database_sync_to_async
from mcp import UrlElicitationRequiredError, types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from handoff.mcp.caller import Caller, legacy_agent
from handoff.mcp.input_required import state_sign
from handoff.snapshot_tools import Route
from policy.decisions import Denial
from policy.identity import person_digest
from registry.credentials import credential_seal
from registry.models import Upstream
from registry.personal import (
    CREDENTIAL_EXPIRED,
    CREDENTIAL_REQUIRED,
    CREDENTIAL_REVOKED,
    INBOUND,
    PERSON_REQUIRED,
    CredentialRef,
    connect_link,
    inbound_fingerprint,
    personal_state,
)

# Read on every call, in every process: a replace, a disconnect or a revoke holds for the very next call (a process
# that remembered a usable credential, even for a second, kept serving the old one).
_state = database_sync_to_async(personal_state, thread_sensitive=False)

CONNECT_AGAIN = (CREDENTIAL_REQUIRED, CREDENTIAL_EXPIRED, CREDENTIAL_REVOKED)  # lift once the person connects
CONNECTED = (Upstream.PersonConnect.TOKEN, Upstream.PersonConnect.OAUTH)  # kinds a person connects (not exchange)
CONNECT_ROUND = "connect"  # a requestState's kind: the retry after connecting runs the call afresh


def connect_refusal(code: str, caller: Caller, route: Route, name: str) -> Denial:
    slug = route.upstream_slug
    url = connect_link(caller.public_url, slug, caller.person_issuer, caller.person_subject)
    message = {
        CREDENTIAL_REQUIRED: f"{slug} acts as each person: connect your account at {url}, then call {name} again.",
        CREDENTIAL_EXPIRED: f"Your connection to {slug} ran out and could not be renewed: connect again at {url}, "
        f"then call {name} again.",
        CREDENTIAL_REVOKED: f"An administrator revoked your connection to {slug}: connect again at {url}, then call "
        f"{name} again.",
    }[code]
    return Denial(code, message, connect_url=url)


async def credential_for(caller: Caller, route: Route, name: str) -> CredentialRef | Denial:
    """Whose credential the call uses, or why there is none."""
    slug = route.upstream_slug
    if not caller.person_subject:
        message = (
            f"{slug} acts as each person, and this API key names nobody: sign in with OAuth, or use a personal key."
        )
        return Denial(PERSON_REQUIRED, message)
    person = person_digest(caller.person_issuer, caller.person_subject)
    if route.per_person == Upstream.PersonConnect.EXCHANGE:
        if not caller.token:
            message = f"{slug} takes your sign-in token (exchanged for its own): sign in with OAuth, not a key."
            return Denial(PERSON_REQUIRED, message)
        sealed = credential_seal(caller.token, name=INBOUND)
        return CredentialRef(person, route.per_person, inbound_fingerprint(caller.token), inbound=sealed)
    state = await _state(route.upstream_id, caller.person_issuer, caller.person_subject)
    if state is None:
        return connect_refusal(CREDENTIAL_REQUIRED, caller, route, name)
    credential_id, kind, version, problem = state
    if problem:
        return connect_refusal(problem, caller, route, name)
    return CredentialRef(person, kind, str(version), credential_id)


def _url_mode(ctx: ServerRequestContext) -> bool:
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities else None
    return bool(elicitation and elicitation.url is not None)


def connect_ask(
    ctx: ServerRequestContext, caller: Caller, name: str, upstream: str, denial: Denial, request_id: str
) -> MCPError | types.InputRequiredResult:
    """How a refusal that lifts once the person connects reaches them: a client that declared URL-mode
    elicitation is asked to open the link the way its era asks (2025-11-25: the -32042 error; 2026-07-28: an
    input-required result whose retry runs the call afresh); any other gets the refusal, link in its message."""
    if not _url_mode(ctx):
        return MCPError(denial.jsonrpc_code, denial.message, denial.data() | {"requestId": request_id})
    if legacy_agent(ctx):
        ask = types.ElicitRequestURLParams(message=denial.message, url=denial.connect_url, elicitation_id=request_id)
        return UrlElicitationRequiredError([ask], denial.message)
    params = {"mode": "url", "message": denial.message, "url": denial.connect_url}
    request = types.ElicitRequest.model_validate({"method": "elicitation/create", "params": params})
    state = state_sign(caller, name, upstream, k=CONNECT_ROUND)
    return types.InputRequiredResult(input_requests={"connect": request}, request_state=state)
