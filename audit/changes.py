"""What an admin change did, as before/after pairs of the fields it changed, with secrets masked.

A masked value still changes when the secret does (it is a short hash of the sealed value, which is random
per seal and reveals nothing), so the trail shows that a credential changed, never what it is.
"""

import hashlib
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Model

# Bookkeeping, and a key's digest (a hash of a secret is no business of the trail's).
IGNORED = frozenset(
    {
        "id",
        "created_at",
        "updated_at",
        "revision",
        "last_synced_at",
        "last_sync_error",
        "protocol_version",
        "instructions",
        "digest",
        "last_login",
    }
)
MASKED = frozenset({"password"})  # an operator's password hash: shown changed, never shown


def _masked(value: Any) -> str:
    return "•••• " + hashlib.sha256(str(value).encode()).hexdigest()[:8]


def _url_masked(url: str) -> str:
    """A URL without what may be a credential: the user part and the query's values."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"••••@{host}" if "@" in parts.netloc else host
    query = "&".join(f"{pair.partition('=')[0]}=••••" for pair in parts.query.split("&") if pair)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def object_state(obj: Model, *, secret_maps: tuple[str, ...] = (), urls: tuple[str, ...] = ()) -> dict[str, Any]:
    """The object's own fields as the audit shows them: relations by name, maps of secrets masked."""
    state: dict[str, Any] = {}
    for field in obj._meta.concrete_fields:
        if field.name in IGNORED:
            continue
        if field.is_relation:
            related = getattr(obj, field.name)
            state[field.name] = str(related) if related is not None else None
        elif field.name in MASKED:
            state[field.name] = _masked(field.value_from_object(obj))
        elif field.name in secret_maps:
            state[field.name] = {key: _masked(value) for key, value in (field.value_from_object(obj) or {}).items()}
        elif field.name in urls:
            state[field.name] = _url_masked(field.value_from_object(obj) or "")
        else:
            state[field.name] = field.value_from_object(obj)
    return json.loads(json.dumps(state, cls=DjangoJSONEncoder))  # dates, decimals and UUIDs as JSON has them


def change_detail(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """{"before": ..., "after": ...} of the fields that differ (all of them on a creation or deletion)."""
    if before is None or after is None:
        return {"before": before, "after": after}
    changed = sorted(name for name in after.keys() | before.keys() if before.get(name) != after.get(name))
    return {"before": {n: before.get(n) for n in changed}, "after": {n: after.get(n) for n in changed}}
