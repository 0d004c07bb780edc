"""The claim-check store: carry-over state too large to ride in a delegation token waits here, under a
random id, until the specialist redeems it once. Redis (GETDEL: atomic, so of two concurrent redemptions
exactly one gets the state) with REDIS_URL; the database in the embedded default."""

import json
import secrets
from datetime import timedelta
from functools import cache
from typing import Any, Protocol

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gateway_project.lib.database import database_async
from gateway_project.lib.redis_clients import async_redis
from handoff.models import ClaimCheck

# The state outlives the token that names it by the clock skew the verifier allows, and no more.
CLAIM_TTL_SECONDS = 120


class ClaimStore(Protocol):
    async def put(self, state: Any) -> str: ...

    async def redeem(self, claim_id: str) -> Any | None:
        """The state, exactly once; None when it was redeemed before, expired, or never existed."""


def _new_id() -> str:
    return secrets.token_urlsafe(24)


class RedisClaimStore:
    def _key(self, claim_id: str) -> str:
        return f"{settings.GATEWAY_REDIS_PREFIX}claim:{claim_id}"

    async def put(self, state: Any) -> str:
        claim_id = _new_id()
        await async_redis().set(self._key(claim_id), json.dumps(state), ex=CLAIM_TTL_SECONDS)
        return claim_id

    async def redeem(self, claim_id: str) -> Any | None:
        raw = await async_redis().getdel(self._key(claim_id))
        return None if raw is None else json.loads(raw)


class DatabaseClaimStore:
    async def put(self, state: Any) -> str:
        claim_id = _new_id()
        expires = timezone.now() + timedelta(seconds=CLAIM_TTL_SECONDS)
        await database_async(ClaimCheck.objects.create)(id=claim_id, state=state, expires_at=expires)
        return claim_id

    async def redeem(self, claim_id: str) -> Any | None:
        return await database_async(_redeem_row)(claim_id)


def _redeem_row(claim_id: str) -> Any | None:
    with transaction.atomic():
        ClaimCheck.objects.filter(expires_at__lt=timezone.now()).delete()
        row = ClaimCheck.objects.filter(pk=claim_id).first()
        # Whoever deletes the row owns the state: of two concurrent redemptions only one deletes it.
        if row is None or ClaimCheck.objects.filter(pk=claim_id).delete()[0] != 1:
            return None
        return row.state


@cache
def claim_store() -> ClaimStore:
    return RedisClaimStore() if settings.REDIS_URL else DatabaseClaimStore()
