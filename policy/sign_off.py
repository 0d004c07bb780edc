"""Sign-off (docs/policy.md, "Sign-off"): a person signs off one call before it runs, where a sign-off rule asks.
State lives in the database (policy.models.SignOff), so any web process answers a call that comes back and a
restart loses no request. A request binds the caller, the upstream and tool, the arguments' RFC 8785 digest, the
rule's id and version and the tool's pinned definition; a grant lets exactly one such call run."""

import hashlib
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from functools import partial
from typing import Any

import rfc8785
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.models import AuditEvent
from audit.services import audit_record
from policy.decisions import SignOffTerms
from policy.models import Person, SignOff, TeamRole
from policy.selectors import teams_of
from policy.sign_off_listeners import sign_off_asked_tell, sign_off_decided_tell

State = SignOff.State
REASON_CHARS = 500


def arguments_digest(arguments: Any) -> str:
    """SHA-256 of the arguments' RFC 8785 canonical JSON: key order is no change, other bytes in a string are."""
    return hashlib.sha256(rfc8785.dumps(arguments)).hexdigest()


@dataclass(frozen=True)
class Binding:
    """The call a sign-off covers (policy.models.BINDING)."""

    agent_id: int
    key_prefix: str
    person_issuer: str
    person_subject: str
    client_id: str
    upstream: str
    tool: str
    arguments_sha256: str
    definition_sha256: str
    rule_id: int
    rule_version: int

    def lookup(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Asking:
    """What a call that needs sign-off brings besides its binding."""

    binding: Binding
    terms: SignOffTerms
    team_id: int
    exposed_name: str
    arguments: dict[str, Any]
    request_id: uuid.UUID
    audited: dict[str, Any]  # who calls, as the call's own audit rows name them
    caller_user: int | None = None  # the console account a personal key or the built-in server names


@dataclass(frozen=True)
class Settled:
    """Where a call that needs sign-off stands: `granted` (it may run: this sign-off is now used by it),
    `pending` (asked, or attached to the request already open), `refused` (a person refused this very call
    within its request's wait) or `busy` (the caller has too many requests open)."""

    state: str
    sign_off: SignOff | None = None


def sign_off_settle(asking: Asking) -> Settled:
    """The call's standing, in one transaction: a usable grant is taken, else an open request joined, a recent
    refusal reported, or a request opened (bounded per caller)."""
    now, binding = timezone.now(), asking.binding
    matching = SignOff.objects.filter(**binding.lookup())
    with transaction.atomic():
        granted = (
            matching.select_for_update(skip_locked=True)
            .filter(state=State.GRANTED, usable_until__gt=now)
            .order_by("decided_at")
            .first()
        )
        if granted is not None:
            granted.state, granted.used_at, granted.used_by = State.USED, now, asking.request_id
            granted.save(update_fields=["state", "used_at", "used_by"])
            return Settled(State.GRANTED, granted)
    pending = matching.filter(state=State.PENDING).first()
    if pending is not None and pending.wait_until > now:
        return Settled(State.PENDING, pending)
    if pending is not None:
        _expire(pending)
    refused = matching.filter(state=State.REFUSED, wait_until__gt=now).order_by("-decided_at").first()
    if refused is not None:
        return Settled(State.REFUSED, refused)
    waiting = SignOff.objects.filter(
        state=State.PENDING,
        wait_until__gt=now,
        agent_id=binding.agent_id,
        key_prefix=binding.key_prefix,
        person_issuer=binding.person_issuer,
        person_subject=binding.person_subject,
    )
    if waiting.count() >= settings.GATEWAY_SIGN_OFF_PENDING_PER_CALLER:
        return Settled("busy", waiting.order_by("wait_until").first())
    try:
        return Settled(State.PENDING, _ask(asking, now))
    except IntegrityError:  # an identical call asked first, a moment ago: join it
        return Settled(State.PENDING, matching.get(state=State.PENDING))


def _ask(asking: Asking, now: Any) -> SignOff:
    terms = asking.terms
    with transaction.atomic():
        made = SignOff.objects.create(
            **asking.binding.lookup(),
            caller_user_id=asking.caller_user or _account_of(asking.binding),
            team_id=asking.team_id,
            person_name=asking.audited.get("person_name", ""),
            exposed_name=asking.exposed_name,
            signers_id=terms.signers,
            four_eyes=terms.four_eyes,
            by_form=terms.by_form,
            valid_seconds=round(terms.valid),
            arguments=asking.arguments,
            request_id=asking.request_id,
            asked_at=now,
            wait_until=now + timedelta(seconds=terms.wait),
        )
        audit_record(
            kind=AuditEvent.Kind.SIGNOFF_ASKED,
            **_row(made),
            **asking.audited,
            detail={
                "sign_off": str(made.id),
                "rule": terms.rule_id,
                "rule_version": terms.rule_version,
                "signers": made.signers.name if made.signers else "the caller",
                "four_eyes": terms.four_eyes,
                "wait_until": made.wait_until.isoformat(),
            },
        )
        transaction.on_commit(partial(sign_off_asked_tell, str(made.id)), robust=True)
    return made


def _account_of(binding: Binding) -> int | None:
    """The console account of a person an identity provider named, once they signed in to My account."""
    if not binding.person_subject:
        return None
    found = Person.objects.filter(issuer=binding.person_issuer, subject=binding.person_subject)
    return found.values_list("user_id", flat=True).first()


def _row(sign_off: SignOff) -> dict[str, Any]:
    """The columns every sign-off row holds: the call it is about."""
    return {
        "request_id": sign_off.request_id,
        "upstream": sign_off.upstream,
        "tool": sign_off.tool,
        "exposed_name": sign_off.exposed_name,
        "arguments_sha256": sign_off.arguments_sha256,
    }


def _caller_row(sign_off: SignOff) -> dict[str, Any]:
    return {
        "agent_id": sign_off.agent_id,
        "agent_name": sign_off.agent.name,
        "team": sign_off.team.slug,
        "person_issuer": sign_off.person_issuer,
        "person_subject": sign_off.person_subject,
        "person_name": sign_off.person_name,
        "client_id": sign_off.client_id,
    }


def _expire(sign_off: SignOff) -> bool:
    """Expire a request no one decided in time, or a grant no call used in time (once: a racing sweep loses)."""
    was = sign_off.state
    with transaction.atomic():
        changed = SignOff.objects.filter(pk=sign_off.pk, state=was).update(state=State.EXPIRED, arguments=None)
        if changed:
            audit_record(
                kind=AuditEvent.Kind.SIGNOFF_EXPIRED,
                **_row(sign_off),
                **_caller_row(sign_off),
                detail={"sign_off": str(sign_off.id), "was": was},
            )
    return bool(changed)


def sign_off_state(ident: str) -> str:
    """Where one request stands now; a pending one past its wait is expired first (with its row)."""
    found = SignOff.objects.select_related("agent", "team").filter(pk=ident).first()
    if found is None:
        return State.EXPIRED
    if found.state == State.PENDING and found.wait_until <= timezone.now():
        _expire(found)  # or a racing decision or sweep settled it first
        found.refresh_from_db(fields=["state"])
    return found.state


def sign_offs_expire() -> int:
    """Expire every request past its wait and every grant past its use (the sweep: audit.settle_outcomes's beat)."""
    now = timezone.now()
    stale = SignOff.objects.filter(state=State.PENDING, wait_until__lte=now) | SignOff.objects.filter(
        state=State.GRANTED, usable_until__lte=now
    )
    return sum(_expire(sign_off) for sign_off in stale.select_related("agent", "team"))


class SignOffRefused(Exception):
    """A decision that may not be made: `status` is the REST API's answer to it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _is_caller(user: AbstractBaseUser, sign_off: SignOff) -> bool:
    return sign_off.caller_user_id is not None and sign_off.caller_user_id == user.pk


def approver_refusal(user: AbstractBaseUser, sign_off: SignOff) -> SignOffRefused | None:
    """Why this account may not sign off this request (None if it may): the rule's console group, in the caller's
    team, or with no group the caller themself; with four eyes, never the caller. Another team's request is as
    unknown as one that does not exist."""
    caller = _is_caller(user, sign_off)
    if sign_off.signers_id is None:
        return None if caller else SignOffRefused(403, "Only the person who made this call may sign it off.")
    teams = teams_of(user=user, roles=TeamRole.values)
    if teams is not None and sign_off.team.slug not in teams:
        return SignOffRefused(404, f"No sign-off request {str(sign_off.id)!r}.")
    if not user.groups.filter(pk=sign_off.signers_id).exists():
        group = sign_off.signers.name if sign_off.signers else "(deleted)"
        return SignOffRefused(403, f"Only members of the console group {group!r} may sign off this call.")
    if sign_off.four_eyes and caller:
        return SignOffRefused(403, "This rule asks for four eyes: someone other than the caller must sign off.")
    return None


def sign_offs_for(user: AbstractBaseUser) -> list[SignOff]:
    """The requests this account may decide, pending, oldest first (the console queue and the REST API)."""
    pending = SignOff.objects.filter(state=State.PENDING, wait_until__gt=timezone.now()).select_related(
        "agent", "team", "signers"
    )
    return [sign_off for sign_off in pending.order_by("asked_at") if approver_refusal(user, sign_off) is None]


def sign_off_decide(*, sign_off_id: str, user: AbstractBaseUser, grant: bool, reason: str = "") -> SignOff:
    """Grant or refuse a pending request, as this account; the arguments are dropped once decided."""
    try:
        found = SignOff.objects.select_related("agent", "team", "signers").get(pk=uuid.UUID(str(sign_off_id)))
    except (ValueError, SignOff.DoesNotExist):
        raise SignOffRefused(404, f"No sign-off request {sign_off_id!r}.") from None
    if refusal := approver_refusal(user, found):
        raise refusal
    if not grant and not reason.strip():
        raise SignOffRefused(400, "Say why you refuse: the caller is told.")
    return _decided(found, grant, reason, by=user.get_username(), actor=user.get_username())


def sign_off_form_answer(*, sign_off_id: str, grant: bool, reason: str = "") -> SignOff:
    """The caller's answer to the form their own client showed, where the rule allows it (never four eyes: the
    agent's channel answered). Audited as a form's, with no console account acting."""
    found = SignOff.objects.select_related("agent", "team", "signers").get(pk=sign_off_id)
    if not found.by_form or found.signers_id is not None or found.four_eyes:
        raise SignOffRefused(403, "This rule does not let the caller sign off in their own client.")
    by = f"{found.person_name or found.agent.name} (a form in their client)"[:150]
    return _decided(found, grant, reason or ("" if grant else "refused in their client"), by=by, form=True)


def _decided(found: SignOff, grant: bool, reason: str, *, by: str, actor: str = "", form: bool = False) -> SignOff:
    if len(reason) > REASON_CHARS:
        raise SignOffRefused(400, f"Give a reason of at most {REASON_CHARS} characters.")
    now = timezone.now()
    if found.state != State.PENDING:
        raise SignOffRefused(409, f"This request was already {found.state}{_by(found)}.")
    if found.wait_until <= now:
        _expire(found)
        raise SignOffRefused(409, "This request expired before it was decided.")
    state = State.GRANTED if grant else State.REFUSED
    usable = now + timedelta(seconds=found.valid_seconds) if grant else None
    with transaction.atomic():
        changed = SignOff.objects.filter(pk=found.pk, state=State.PENDING).update(
            state=state, decided_at=now, decided_by=by, reason=reason, usable_until=usable, arguments=None
        )
        if not changed:  # decided by someone else a moment ago
            found.refresh_from_db()
            raise SignOffRefused(409, f"This request was already {found.state}{_by(found)}.")
        transaction.on_commit(partial(sign_off_decided_tell, str(found.id)), robust=True)
        detail = {"sign_off": str(found.id), "reason": reason} | ({"by": "form"} if form else {})
        audit_record(
            kind=AuditEvent.Kind.SIGNOFF_GRANTED if grant else AuditEvent.Kind.SIGNOFF_REFUSED,
            **_row(found),
            **_caller_row(found),
            actor=actor,
            detail=detail | ({"usable_until": usable.isoformat()} if usable else {}),
        )
    found.refresh_from_db()
    return found


def _by(sign_off: SignOff) -> str:
    return f" by {sign_off.decided_by}" if sign_off.decided_by else ""
