"""OAuth sign-ins under way at upstreams' authorization servers (registry.ConnectAttempt): each opened with a fresh
`state` that only the person's browser holds (the row keeps its SHA-256), and taken once, by that person."""

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from registry.models import ConnectAttempt, Upstream

UNKNOWN = "unknown"  # no such sign-in, or it was finished already
EXPIRED = "expired"
SOMEONE_ELSE = "someone else"  # begun for another person than the one signed in


class AttemptRefused(Exception):
    def __init__(self, reason: str, upstream: Upstream | None = None) -> None:
        super().__init__(reason)
        self.reason, self.upstream = reason, upstream


def _digest(state: str) -> str:
    return hashlib.sha256(state.encode()).hexdigest()


def connect_attempt_open(*, upstream: Upstream, person: tuple[str, str, str], material: dict) -> str:
    """Record a sign-in `person` (issuer, subject, name) begins, with the executor's sealed `material`; the `state`
    to send along. Attempts left unfinished past their time go at the same moment."""
    now = timezone.now()
    ConnectAttempt.objects.filter(expires_at__lt=now).delete()
    state = secrets.token_urlsafe(32)
    issuer, subject, name = person
    ConnectAttempt.objects.create(
        state_sha256=_digest(state),
        upstream=upstream,
        person_issuer=issuer,
        person_subject=subject,
        person_name=name,
        material=material,
        expires_at=now + timedelta(seconds=settings.GATEWAY_CONNECT_SECONDS),
    )
    return state


def connect_attempt_take(*, state: str, people: set[tuple[str, str]]) -> ConnectAttempt:
    """The sign-in `state` names, gone from the store so that it is finished at most once; one of `people` (issuer,
    subject) must have begun it (someone else's is left for its person). Raises AttemptRefused."""
    attempt, refused = _taken(state, people)
    if refused:  # raised once the transaction is over: an expired attempt's deletion stands
        raise refused
    return attempt


@transaction.atomic
def _taken(state: str, people: set[tuple[str, str]]) -> tuple[ConnectAttempt | None, AttemptRefused | None]:
    attempt = (
        ConnectAttempt.objects.select_for_update()
        .select_related("upstream")
        .filter(state_sha256=_digest(state))
        .first()
    )
    if not state or attempt is None:
        return None, AttemptRefused(UNKNOWN)
    if (attempt.person_issuer, attempt.person_subject) not in people:
        return None, AttemptRefused(SOMEONE_ELSE, attempt.upstream)
    ConnectAttempt.objects.filter(pk=attempt.pk).delete()
    if attempt.expires_at <= timezone.now():
        return None, AttemptRefused(EXPIRED)
    return attempt, None
