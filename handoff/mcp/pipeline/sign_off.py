"""The sign-off stage: where a sign-off rule asks (policy/sign_off.py), a call runs only on a person's grant of this
very call, which it then uses up. Without one it asks (or joins the request already open). A 2025-11-25 session's
call then waits for the decision, up to GATEWAY_SIGN_OFF_HOLD_SECONDS within the request's wait, with progress
notifications when it carries a progressToken; any other call, or one still undecided, is told to come back. The
denied row names the request; the approved row comes only with the grant. It runs before admission, so a call
waiting for a person holds no share of any limit, and a waiting call holds an event, not a thread nor a database
connection: decisions wake it through the change relay, from whichever web process made them."""

import asyncio
import json
import math
import time
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.utils import timezone
from mcp import types
from mcp.shared.exceptions import MCPError

from gateway_project.lib.database import database_async
from handoff.mcp.caller import Caller, legacy_agent
from handoff.mcp.input_required import state_sign
from handoff.mcp.list_changed import change_relay, relay_everywhere, relay_handlers
from handoff.mcp.pipeline.call import AGENT, CODE, Call
from handoff.mcp.pipeline.task_state import TaskCancelled
from policy.decisions import POLICY_DENIED, RETRY_LATER, Denial
from policy.models import SignOff
from policy.sign_off import (
    Asking,
    Binding,
    Settled,
    SignOffRefused,
    arguments_digest,
    sign_off_form_answer,
    sign_off_settle,
    sign_off_state,
)

PENDING, REFUSED, REQUIRED, BUSY = "SIGNOFF_PENDING", "SIGNOFF_REFUSED", "SIGNOFF_REQUIRED", "SIGNOFF_BUSY"
EXPIRED = "SIGNOFF_EXPIRED"
DECIDED = "sign_off.decided"  # the relay's message: {"type": DECIDED, "id": <sign-off id>}
PROGRESS_SECONDS = 10.0  # between progress notifications to a waiting call
RECHECK_SECONDS = 60.0  # a waiting call reads its request again this often, should a wake-up be lost
FORM = {"type": "object", "properties": {"reason": {"type": "string", "title": "Why", "maxLength": 500}}}
FORM_ROUND = "sign_off"  # a requestState's kind: the retry carries the caller's answer to the form
_waiting: dict[str, set[asyncio.Event]] = {}  # this process's waiting calls, by sign-off id


async def _decided_here(message: dict) -> None:
    for event in _waiting.get(str(message.get("id")), ()):
        event.set()


relay_handlers[DECIDED] = _decided_here


def decided_tell(ident: str) -> None:
    """Wake the calls waiting for this request, in every web process (policy/sign_off_listeners.py). A wake-up
    lost (the channel layer down: logged by the decision's on_commit) delays a call until its next read of the
    request, never loses the decision."""
    async_to_sync(relay_everywhere)({"type": DECIDED, "id": ident})


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
        caller_user=_account(caller),
    )
    settled = await database_async(sign_off_settle)(asking)
    if settled.state == SignOff.State.PENDING and terms.signers is not None and (call.task is not None or _holds(call)):
        assert settled.sign_off is not None
        # A task waits as long as the request does. What waits holds the request's id and deadline, not its row.
        ident, waits_until = str(settled.sign_off.id), settled.sign_off.wait_until
        hold = settings.GATEWAY_SIGN_OFF_HOLD_SECONDS if call.task is None else math.inf
        del settled
        settled = await _wait(call, asking, ident, min(hold, (waits_until - timezone.now()).total_seconds()))
    elif settled.state == SignOff.State.PENDING and terms.by_form and _holds(call) and _asks_forms(call):
        settled = await _by_form(call, asking, settled)
    if settled.state == SignOff.State.GRANTED:
        assert settled.sign_off is not None
        call.signed_off = str(settled.sign_off.id)
        return
    call.denial = _denial(call, settled)


def _account(caller: Caller) -> int | None:
    """The console account a personal key or the built-in server's token names: its own issuer, a user's id."""
    own = caller.person_issuer and caller.person_issuer == caller.public_url
    return int(caller.person_subject) if own and caller.person_subject.isdigit() else None


def _asks_forms(call: Call) -> bool:
    """Whether the agent's client shows forms: it declared elicitation, in form mode (an empty declaration is)."""
    assert call.ctx is not None
    capabilities = call.ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


async def _by_form(call: Call, asking: Asking, settled: Settled) -> Settled:
    """Ask the caller in their own client, where the rule allows it: accepted, the call runs; declined, refused;
    dismissed, still pending (the link is in the refusal)."""
    assert settled.sign_off is not None and call.ctx is not None
    ident = str(settled.sign_off.id)
    try:
        answer = await call.ctx.session.elicit_form(_question(call), FORM, related_request_id=call.ctx.request_id)
    except MCPError:  # the client could not show it (NoBackChannelError among them): the link stands
        return settled
    if answer.action == "cancel":
        return settled
    reason = str((answer.content or {}).get("reason", ""))[:500]
    try:
        await database_async(sign_off_form_answer)(sign_off_id=ident, grant=answer.action == "accept", reason=reason)
    except SignOffRefused:  # decided or expired meanwhile: as it stands now
        pass
    return await database_async(sign_off_settle)(asking)


def _question(call: Call) -> str:
    arguments = json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)
    return f"Sign off this call of {call.name!r} with {arguments}? Accept runs it, once; decline refuses it."


def form_round(call: Call, denial: Denial) -> types.InputRequiredResult | None:
    """A 2026-07-28 call its caller may sign off in their own client (the rule allows a form, and the request declares
    form elicitation): an input-required round asking them; the retry carries the answer (`form_answered`)."""
    ctx, caller, terms = call.ctx, call.caller, call.sign_off
    if ctx is None or caller is None or terms is None or not terms.by_form or denial.code != PENDING:
        return None
    if legacy_agent(ctx) or call.origin != AGENT or not _asks_forms(call):
        return None
    params = {"mode": "form", "message": _question(call), "requestedSchema": FORM}
    request = types.ElicitRequest.model_validate({"method": "elicitation/create", "params": params})
    state = state_sign(caller, call.name, call.upstream, k=FORM_ROUND, o=denial.sign_off)
    return types.InputRequiredResult(input_requests={FORM_ROUND: request}, request_state=state)


async def form_answered(state: dict[str, Any], responses: dict[str, Any]) -> None:
    """The caller's answer to the form round, carried by the retry: accepted, the request is granted (and the retry
    uses the grant); declined, refused; dismissed or missing, it stays pending (and the retry asks again)."""
    answer = responses.get(FORM_ROUND)
    action = answer.get("action") if isinstance(answer, dict) else None
    if action not in ("accept", "decline"):
        return
    reason = str((answer.get("content") or {}).get("reason", ""))[:500]
    try:
        await database_async(sign_off_form_answer)(sign_off_id=str(state["o"]), grant=action == "accept", reason=reason)
    except SignOffRefused:  # decided or expired meanwhile: the retry finds it as it stands
        pass


def _holds(call: Call) -> bool:
    """Whether the call may wait for the decision: an agent's, in a 2025-11-25 session."""
    ctx = call.ctx
    return call.origin == AGENT and ctx is not None and legacy_agent(ctx) and settings.GATEWAY_SIGN_OFF_HOLD_SECONDS > 0


async def _wait(call: Call, asking: Asking, ident: str, hold: float) -> Settled:
    """Wait up to `hold` seconds for the request's decision, then settle again: take the grant, or learn of the
    refusal. Undecided at the end of the hold: still pending; past the request's wait: expired. A task's wait ends
    when it is cancelled (TaskCancelled), the request left pending."""
    assert call.ctx is not None
    started = time.monotonic()
    event = asyncio.Event()
    _waiting.setdefault(ident, set()).add(event)
    if call.task is not None:
        call.task.waits(f"Waiting for a person to sign off this call (sign-off request {ident}).", event, ident)
    try:
        await change_relay.ensure_running()  # heard from now on; a decision made before is read below
        checked = 0.0
        while True:
            if call.task is not None and call.task.ended:
                raise TaskCancelled(ident)
            waited = time.monotonic() - started
            if event.is_set() or waited - checked >= RECHECK_SECONDS or waited >= hold:
                event.clear()
                checked = waited
                state = await database_async(sign_off_state)(ident)
                if state != SignOff.State.PENDING and state != SignOff.State.EXPIRED:
                    return await database_async(sign_off_settle)(asking)
                if state == SignOff.State.EXPIRED or waited >= hold:
                    row = await database_async(SignOff.objects.get)(id=ident)
                    return Settled(EXPIRED if state == SignOff.State.EXPIRED else state, row)
            left = hold - waited
            message = f"Waiting for a person to sign off this call (request {ident})."
            await call.ctx.session.report_progress(waited, hold, message)  # only if the agent asked for progress
            try:
                async with asyncio.timeout(min(PROGRESS_SECONDS, left, RECHECK_SECONDS)):  # no task per waiting call
                    await event.wait()
            except TimeoutError:
                pass
    finally:
        _waiting[ident].discard(event)
        if not _waiting[ident]:
            del _waiting[ident]


def _denial(call: Call, settled: Settled) -> Denial:
    sign_off = settled.sign_off
    assert sign_off is not None
    name, ident = call.name, str(sign_off.id)
    if settled.state == EXPIRED:
        message = (
            f"No one signed off this call of {name!r} in time: its request ({ident}) expired. Make the call again "
            "to ask anew, or tell the user someone must sign it off."
        )
        return Denial(EXPIRED, message, POLICY_DENIED, sign_off=ident)
    if settled.state == SignOff.State.REFUSED:
        message = (
            f"{sign_off.decided_by} refused to sign off this call of {name!r}: {sign_off.reason} "
            "Do not retry it unchanged."
        )
        return Denial(REFUSED, message, POLICY_DENIED, sign_off=ident)
    left = max((sign_off.wait_until - timezone.now()).total_seconds(), 0.0)
    if settled.state == "busy":  # policy.sign_off.Settled
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
    retry = min(float(settings.GATEWAY_SIGN_OFF_RETRY_SECONDS), left)
    if sign_off.signers_id is None:  # the caller signs off: a link they open (URL elicitation where declared)
        assert call.caller is not None
        link = f"{call.caller.public_url}/account/sign-offs/{ident}/"
        message = (
            f"{name!r} runs only once you sign off this very call: open {link}, sign in, and sign it off within "
            f"{round(left)} seconds; then make the same call again, with the same arguments."
        )
        return Denial(PENDING, message, RETRY_LATER, retry, connect_url=link, sign_off=ident)
    message = (
        f"{name!r} runs only once a person signs off this very call. It is asked for (sign-off request {ident}), "
        f"for {round(left)} more seconds: make the same call again, with the same arguments, after `retryAfter`."
    )
    return Denial(PENDING, message, RETRY_LATER, retry, sign_off=ident)
