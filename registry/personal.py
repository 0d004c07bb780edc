"""Personal credentials, as the web process and the console handle them: connect (seal and store), disconnect,
revoke, and what a call is decided on. Nothing here opens a value: the executor does (registry/upstreams/person.py).

A call to a per-person upstream carries a reference to the caller's credential (`CredentialRef`), never the
credential: the executor reads and opens it, and reconnects when its version changes.
"""

import hashlib
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime

from django.core import signing
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from audit.services import audit_record, audit_record_per_team
from policy.identity import person_digest
from registry.models import PersonalCredential, Upstream
from registry.secret_store import secret_path, secret_store, secrets_open, secrets_seal

CREDENTIAL_REQUIRED = "CREDENTIAL_REQUIRED"  # none yet: connect
CREDENTIAL_EXPIRED = "CREDENTIAL_EXPIRED"  # it ran out and could not be refreshed: connect again
CREDENTIAL_REVOKED = "CREDENTIAL_REVOKED"  # an administrator revoked it: connect again
PERSON_REQUIRED = "PERSON_REQUIRED"  # the caller is an agent, not a person: nobody to act for
INBOUND = "switchboard inbound token"  # what an exchange's sealed inbound token is bound to
LINK_SALT = "switchboard.connect-link"
LINK_SECONDS = 24 * 3600


@dataclass(frozen=True)
class CredentialRef:
    """Whose credential a call uses, as it travels to the executor (signed with the task, in Celery mode)."""

    person: str  # the person's digest
    kind: str  # token, oauth or exchange
    version: str  # the stored credential's version; for an exchange, the inbound token's fingerprint
    id: int = 0  # the stored credential (none for an exchange)
    inbound: str = ""  # an exchange's: the person's own token, sealed for the executor

    def wire(self) -> dict:
        return asdict(self)

    def named(self) -> dict:
        """What the audit says of it: which credential, never its value."""
        return {"id": self.id, "kind": self.kind} if self.id else {"kind": self.kind}


def inbound_fingerprint(token: str) -> str:
    """What tells one inbound token from another without holding it (an exchange's connection version)."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def connect_link(public_url: str, slug: str, issuer: str, subject: str) -> str:
    """Where a person connects `slug`: the page for it, signed for them, so that someone else who opens it is
    refused rather than connecting their own account where the agent expects this person's."""
    made_for = signing.dumps({"p": person_digest(issuer, subject)}, salt=f"{LINK_SALT}:{slug}")
    return f"{public_url}/account/connections/{slug}/?for={made_for}"


def connect_link_person(slug: str, made_for: str) -> str | None:
    """The digest of the person a link (its `for`) was made for, if it is genuine, for `slug`, and not too old."""
    try:
        return signing.loads(made_for, salt=f"{LINK_SALT}:{slug}", max_age=LINK_SECONDS)["p"]
    except (signing.BadSignature, KeyError, TypeError):
        return None


def credential_path(upstream: Upstream, issuer: str, subject: str) -> str:
    """Where a person's credential for `upstream` is stored now: under the upstream's team."""
    return secret_path(team=upstream.team.slug, person=person_digest(issuer, subject), service=upstream.slug)


def stored_path(credential: PersonalCredential, service: str) -> str:
    """Where a credential's values are: under the team its upstream (`service`, its slug) had when they were stored."""
    person = person_digest(credential.person_issuer, credential.person_subject)
    return secret_path(team=credential.secret_team, person=person, service=service)


@transaction.atomic
def personal_connect(
    *,
    upstream: Upstream,
    issuer: str,
    subject: str,
    name: str,
    kind: str,
    values: dict[str, str],
    expires_at: datetime | None = None,
    action: str = "credential_connected",
) -> PersonalCredential:
    """Store a person's credential for `upstream`, sealed at once (`values` in clear, as the person gave them, or
    as the executor got them), replacing one they had; executors reconnect with it on the next call. The audit
    trail records `action` (connected, or refreshed by the executor), naming the credential, never a value."""
    team, path = upstream.team.slug, credential_path(upstream, issuer, subject)
    secret_store().write(path, secrets_seal(path, values))
    credential, made = PersonalCredential.objects.select_for_update().get_or_create(
        upstream=upstream,
        person_issuer=issuer,
        person_subject=subject,
        defaults={"kind": kind, "person_name": name, "expires_at": expires_at, "secret_team": team},
    )
    if not made:
        if credential.secret_team != team:  # the new values are under the upstream's team now: the old ones go
            secret_store().delete(stored_path(credential, upstream.slug))
        credential.kind, credential.person_name, credential.expires_at = kind, name, expires_at
        credential.secret_team = team
        credential.version += 1
        credential.revoked_at, credential.revoked_by, credential.refresh_failed_at = None, "", None
        credential.save()
    _recorded(credential, action, actor=name)
    return credential


def _recorded(credential: PersonalCredential, action: str, *, actor: str) -> None:
    audit_record(
        kind="admin_change",
        actor=actor,
        upstream=credential.upstream.slug,
        person_issuer=credential.person_issuer,
        person_subject=credential.person_subject,
        person_name=credential.person_name,
        detail={"action": action, "credential": {"id": credential.pk, "kind": credential.kind}},
    )


@transaction.atomic  # the change and its audit row, or neither
def personal_disconnect(credential: PersonalCredential) -> None:
    """The person's own disconnect: the values go, and the row (their next call asks them to connect)."""
    secret_store().delete(stored_path(credential, credential.upstream.slug))
    _recorded(credential, "credential_disconnected", actor=credential.person_name)
    credential.delete()


@transaction.atomic  # the change and its audit row, or neither
def personal_revoke(credential: PersonalCredential, *, actor: str) -> None:
    """An administrator's revoke: the values go, the row stays to say so (the person's next call is told)."""
    secret_store().delete(stored_path(credential, credential.upstream.slug))
    PersonalCredential.objects.filter(pk=credential.pk).update(
        revoked_at=timezone.now(), revoked_by=actor, version=F("version") + 1
    )
    _recorded(credential, "credential_revoked", actor=actor)


@transaction.atomic  # the change and its audit row, or neither
def personal_refresh_failed(credential: PersonalCredential) -> None:
    """The executor could not refresh it: the person's next call asks them to connect again."""
    PersonalCredential.objects.filter(pk=credential.pk).update(refresh_failed_at=timezone.now())
    _recorded(credential, "credential_refresh_failed", actor="executor")


def personal_credentials_move(*, actor: str) -> int:
    """Move each credential's values to its upstream's team's path (values stored before teams, or before their
    upstream changed teams), sealed again for it; the number moved. Opens each value, so it runs where the
    private keys are, like the executor. Re-runnable: a credential in place is left alone, and one stopped midway
    still reads from the path its row names (the new copy is written first, the row changed next, the old copy
    deleted last)."""
    per_team: Counter[str] = Counter()
    stray = PersonalCredential.objects.select_related("upstream__team").exclude(secret_team=F("upstream__team__slug"))
    for credential in stray:
        upstream = credential.upstream
        old = stored_path(credential, upstream.slug)
        new = credential_path(upstream, credential.person_issuer, credential.person_subject)
        if values := secret_store().read(old):
            secret_store().write(new, secrets_seal(new, secrets_open(old, values)))
        PersonalCredential.objects.filter(pk=credential.pk).update(secret_team=upstream.team.slug)
        if values:
            secret_store().delete(old)
        per_team[upstream.team.slug] += 1
    details = {team: {"action": "credentials_moved", "credentials": n} for team, n in per_team.items()}
    gateway_wide = {"action": "credentials_moved", "credentials": 0}
    audit_record_per_team(kind="admin_change", actor=actor, details=details, gateway_wide=gateway_wide)
    return per_team.total()


def personal_state(upstream_id: int, issuer: str, subject: str) -> tuple[int, str, int, str] | None:
    """(id, kind, version, problem) of the person's credential for the upstream, or None without one; `problem`
    is CREDENTIAL_REVOKED or CREDENTIAL_EXPIRED when it may not be used, else ""."""
    row = (
        PersonalCredential.objects.filter(upstream_id=upstream_id, person_issuer=issuer, person_subject=subject)
        .values_list("id", "kind", "version", "revoked_at", "refresh_failed_at")
        .first()
    )
    if row is None:
        return None
    credential_id, kind, version, revoked_at, refresh_failed_at = row
    problem = CREDENTIAL_REVOKED if revoked_at else CREDENTIAL_EXPIRED if refresh_failed_at else ""
    return credential_id, kind, version, problem
