"""The sign-off stage: where a sign-off rule asks (policy/sign_off.py), a call runs only on a person's grant of this
very call, which it then uses up. Without one it asks (or joins the request already open) and is told to come
back: its denied row names the request; the approved row comes only with the grant. It runs before admission,
so a call waiting for a person holds no share of any limit."""

from django.conf import settings
from django.utils import timezone

from gateway_project.lib.database import database_async
from handoff.mcp.pipeline.call import CODE, Call
from policy.decisions import POLICY_DENIED, RETRY_LATER, Denial
from policy.sign_off import Asking, Binding, Settled, arguments_digest, sign_off_settle

PENDING, REFUSED, REQUIRED, BUSY = "SIGNOFF_PENDING", "SIGNOFF_REFUSED", "SIGNOFF_REQUIRED", "SIGNOFF_BUSY"


async def sign_off_stage(call: Call) -> None:
    terms, caller, route = call.sign_off, call.caller, call.route
    if terms is None or route is None or call.own:
        return
    assert caller is not None and call.snap is not None
    team = call.snap.agents[caller.agent_id].team
    assert team is not None  # every agent has one
    binding = Binding(
        agent_id=caller.agent_id,
        key_prefix="" if caller.person_subject else caller.key_prefix,
        person_issuer=caller.person_issuer,
        person_subject=caller.person_subject,
        client_id=caller.client_id,
        upstream=route.upstream_slug,
        tool=route.tool,
        arguments_sha256=arguments_digest(call.arguments),
        definition_sha256=call.definition_sha256,
        rule_id=terms.rule_id,
        rule_version=terms.rule_version,
    )
    asking = Asking(
        binding=binding,
        terms=terms,
        team_id=team.id,
        exposed_name=call.name,
        arguments=call.arguments,
        request_id=call.request_id,
        audited=caller.audited,
    )
    settled = await database_async(sign_off_settle)(asking)
    if settled.state == "granted":
        assert settled.sign_off is not None
        call.signed_off = str(settled.sign_off.id)
        return
    call.denial = _denial(call, settled)


def _denial(call: Call, settled: Settled) -> Denial:
    sign_off = settled.sign_off
    assert sign_off is not None
    name, ident = call.name, str(sign_off.id)
    if settled.state == "refused":
        message = (
            f"{sign_off.decided_by} refused to sign off this call of {name!r}: {sign_off.reason} "
            "Do not retry it unchanged."
        )
        return Denial(REFUSED, message, POLICY_DENIED, sign_off=ident)
    left = max((sign_off.wait_until - timezone.now()).total_seconds(), 0.0)
    if settled.state == "busy":
        message = (
            f"You have {settings.GATEWAY_SIGN_OFF_PENDING_PER_CALLER} calls waiting for sign-off already: "
            f"{name!r} was not asked for. Retry once one of them is decided."
        )
        return Denial(BUSY, message, RETRY_LATER, left)
    if call.origin == CODE:  # an execution lives seconds: the call is asked for, and made again outside the code
        message = (
            f"{name!r} runs only once a person signs off this very call; it is asked for (sign-off request "
            f"{ident}). Code cannot wait for it: call the tool directly, with the same arguments, once signed off."
        )
        return Denial(REQUIRED, message, POLICY_DENIED, sign_off=ident)
    message = (
        f"{name!r} runs only once a person signs off this very call. It is asked for (sign-off request {ident}), "
        f"for {round(left)} more seconds: make the same call again, with the same arguments, after `retryAfter`."
    )
    return Denial(
        PENDING, message, RETRY_LATER, min(float(settings.GATEWAY_SIGN_OFF_RETRY_SECONDS), left), sign_off=ident
    )
