"""Agents and their API keys."""

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.db import transaction

from audit.services import audit_record
from policy.models import Agent, AgentKey

KEY_PREFIX = "sb_"


@dataclass(frozen=True)
class IssuedKey:
    agent: Agent
    key: str


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def agent_key_issue(*, agent: Agent, label: str = "", actor: str = "") -> IssuedKey:
    """A new key for the agent. The plain key exists only in the return value: show it once."""
    prefix = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        AgentKey.objects.create(agent=agent, prefix=prefix, digest=_digest(secret), label=label)
        audit_record(
            kind="admin_change",
            actor=actor,
            agent_name=agent.name,
            detail={"action": "agent_key_issued", "prefix": prefix},
        )
    return IssuedKey(agent=agent, key=f"{KEY_PREFIX}{prefix}_{secret}")


def agent_create(*, name: str, actor: str = "") -> IssuedKey:
    with transaction.atomic():
        agent = Agent.objects.create(name=name)
        audit_record(
            kind="admin_change", actor=actor, agent_id=agent.id, agent_name=name, detail={"action": "agent_created"}
        )
        return agent_key_issue(agent=agent, actor=actor)


def agent_authenticate(*, key: str) -> Agent | None:
    """The enabled agent holding this key, or None. The digest comparison is constant-time."""
    if not key.startswith(KEY_PREFIX):
        return None
    prefix, _, secret = key[len(KEY_PREFIX) :].partition("_")
    if not prefix or not secret:
        return None
    record = AgentKey.objects.select_related("agent").filter(prefix=prefix, revoked=False).first()
    # Compare against a dummy digest on a miss so a wrong prefix costs the same as a wrong secret.
    expected = record.digest if record else _digest("")
    if not hmac.compare_digest(expected, _digest(secret)) or record is None:
        return None
    return record.agent if record.agent.enabled else None
