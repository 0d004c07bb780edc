"""A per-person upstream's spec for one person, in the executor: their credential read from the secret store,
opened, refreshed when it ran out (OAuth), or got by token exchange (RFC 8693) of their own sign-in token, and
put where the upstream takes it. Values live in this process's memory only for the connection that uses them."""

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime

from channels.db import database_sync_to_async
from django.utils import timezone

from registry.credentials import CredentialError, credential_open
from registry.models import PersonalCredential, Upstream
from registry.personal import (
    CREDENTIAL_EXPIRED,
    CREDENTIAL_REQUIRED,
    CREDENTIAL_REVOKED,
    INBOUND,
    PERSON_REQUIRED,
    personal_connect,
    personal_refresh_failed,
    stored_path,
)
from registry.secret_store import SecretStoreUnavailable, secret_store, secrets_open
from registry.upstreams.spec import UpstreamSpec
from registry.upstreams.token_grants import GrantFailed, token_exchange, token_refresh

logger = logging.getLogger(__name__)

REFRESH_MARGIN_SECONDS = 30  # a token this close to its end is refreshed before use
STORE_UNAVAILABLE = "CREDENTIAL_STORE_UNAVAILABLE"  # the secret store did not answer: nothing the person can fix
PERSON_REQUIRED_MESSAGE = (
    "This service acts as each person, and this call names nobody: sign in with OAuth, or use a personal key."
)


class CredentialUnusable(Exception):
    """No usable credential for this person: the code (registry/personal.py) and a message they can act on."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def slotted(
    spec: UpstreamSpec, slot: str, token: str, expires_at: float, version: str, credential: int = 0
) -> UpstreamSpec:
    """`spec` with the person's token where the upstream takes it (registry.models.Upstream.person_slot), and which
    stored credential (`credential`, at `version`) it is."""
    kind, _, name = slot.partition(":")
    changes: dict = {"person_credential": credential, "person_version": version, "expires_at": expires_at}
    if kind == "bearer":
        changes["headers"] = spec.headers | {"Authorization": f"Bearer {token}"}
    elif kind == "header":
        changes["headers"] = spec.headers | {name: token}
    elif kind == "query":
        changes["query"] = spec.query | {name: token}
    else:
        changes["env"] = spec.env | {name: token}
    return replace(spec, **changes)


def _epoch(moment: datetime | None) -> float:
    return moment.timestamp() if moment else 0.0


def _in_thread(function):
    return database_sync_to_async(function, thread_sensitive=False)


async def person_spec(upstream: Upstream, ref: dict | None, catalog: bool = False) -> UpstreamSpec:
    """The spec a call for the person `ref` names uses (ref: registry/personal.py CredentialRef's fields); for
    catalog sync and probes, the administrator's designated connection. Raises CredentialUnusable."""
    if ref is None and not catalog:
        raise CredentialUnusable(PERSON_REQUIRED, PERSON_REQUIRED_MESSAGE)
    spec = await _in_thread(UpstreamSpec.from_model)(upstream)
    if ref is not None and ref["kind"] == Upstream.PersonConnect.EXCHANGE:
        return await _exchanged(upstream, spec, ref)
    credential_id = ref["id"] if ref is not None else upstream.catalog_credential_id
    credential = await _in_thread(PersonalCredential.objects.filter(pk=credential_id, upstream=upstream).first)()
    if credential is None and ref is None:
        message = f"{upstream.slug} is per person: choose whose connection syncs its catalog (an admin's own)"
        raise CredentialUnusable(CREDENTIAL_REQUIRED, message)
    if credential is None:
        raise CredentialUnusable(CREDENTIAL_REQUIRED, f"No credential of yours for {upstream.slug}: connect it.")
    return await _stored(upstream, spec, credential)


def _values(path: str) -> dict[str, str]:
    return secrets_open(path, secret_store().read(path))


async def _stored(upstream: Upstream, spec: UpstreamSpec, credential: PersonalCredential) -> UpstreamSpec:
    if credential.revoked_at:
        raise CredentialUnusable(CREDENTIAL_REVOKED, f"Your credential for {upstream.slug} was revoked: connect again.")
    if credential.refresh_failed_at:
        raise CredentialUnusable(CREDENTIAL_EXPIRED, f"Your credential for {upstream.slug} expired: connect again.")
    path = stored_path(credential, upstream.slug)
    try:
        values = await _in_thread(_values)(path)
    except SecretStoreUnavailable as exc:
        logger.warning("personal credential %s: %s", credential.pk, exc)
        unavailable = "The gateway cannot read your credential now: try again soon."
        raise CredentialUnusable(STORE_UNAVAILABLE, unavailable) from None
    except CredentialError as exc:
        logger.warning("personal credential %s does not open: %s", credential.pk, exc)
        unusable = f"Your credential for {upstream.slug} is unusable: connect again."
        raise CredentialUnusable(CREDENTIAL_REQUIRED, unusable) from None
    if "token" not in values:
        raise CredentialUnusable(CREDENTIAL_REQUIRED, f"No credential of yours for {upstream.slug}: connect it.")
    # Noted when a connection opens with it, not per call: what the person's Connections page shows.
    used = PersonalCredential.objects.filter(pk=credential.pk)
    await _in_thread(used.update)(last_used_at=timezone.now())
    expires_at = _epoch(credential.expires_at)
    oauth = credential.kind == PersonalCredential.Kind.OAUTH
    if oauth and expires_at and expires_at - REFRESH_MARGIN_SECONDS < time.time():
        credential, values = await _refreshed(upstream, credential, values)
        expires_at = _epoch(credential.expires_at)
    version = str(credential.version)
    return slotted(spec, upstream.person_slot, values["token"], expires_at, version, credential.pk)


async def _refreshed(
    upstream: Upstream, credential: PersonalCredential, values: dict[str, str]
) -> tuple[PersonalCredential, dict[str, str]]:
    """A refreshed OAuth credential, stored again; a refresh that fails marks it (the person connects again)."""
    try:
        fresh = await token_refresh(values)
    except GrantFailed as failed:
        logger.warning("refreshing personal credential %s failed: %s", credential.pk, failed)
        await _in_thread(personal_refresh_failed)(credential)
        raise CredentialUnusable(
            CREDENTIAL_EXPIRED, f"Your sign-in at {upstream.slug} expired and could not be renewed: connect again."
        ) from None
    expires_at = datetime.fromtimestamp(fresh.expires_at, UTC) if fresh.expires_at else None
    stored = await _in_thread(personal_connect)(
        upstream=upstream,
        issuer=credential.person_issuer,
        subject=credential.person_subject,
        name=credential.person_name,
        kind=credential.kind,
        values=values | fresh.values,
        expires_at=expires_at,
        action="credential_refreshed",
    )
    return stored, values | fresh.values


# Exchanged tokens by (upstream, person, inbound fingerprint): one exchange per sign-in, not per connection.
_exchanged_tokens: dict[tuple[int, str, str], tuple[str, float]] = {}
MAX_EXCHANGED = 10_000


async def _exchanged(upstream: Upstream, spec: UpstreamSpec, ref: dict) -> UpstreamSpec:
    key = (upstream.id, ref["person"], ref["version"])
    token, expires_at = _exchanged_tokens.get(key, ("", 0.0))
    if not token or (expires_at and expires_at - REFRESH_MARGIN_SECONDS < time.time()):
        try:
            inbound = credential_open(ref["inbound"], name=INBOUND)
        except CredentialError as exc:
            raise CredentialUnusable(CREDENTIAL_REQUIRED, "Your sign-in token could not be used here.") from exc
        client = {name: credential_open(value, name=name) for name, value in upstream.person_client.items()}
        try:
            grant = await token_exchange(
                url=upstream.exchange_url,
                client=client,
                subject_token=inbound,
                audience=upstream.exchange_audience or upstream.url,
                scope=upstream.person_scope,
            )
        except GrantFailed as failed:
            logger.warning("token exchange for %s failed: %s", upstream.slug, failed)
            raise CredentialUnusable(
                CREDENTIAL_EXPIRED, f"{upstream.slug} would not accept your sign-in: sign in again, or ask its admins."
            ) from None
        token, expires_at = grant.values["token"], grant.expires_at
        if len(_exchanged_tokens) >= MAX_EXCHANGED:
            _exchanged_tokens.pop(next(iter(_exchanged_tokens)))
        _exchanged_tokens[key] = (token, expires_at)
    return slotted(spec, upstream.person_slot, token, expires_at, ref["version"])
