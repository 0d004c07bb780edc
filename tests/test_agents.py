"""Agents and their API keys: shown once, stored as a hash, compared in constant time."""

import hashlib

from django.core.management import call_command

from handoff.snapshot import snapshot_compile
from policy.models import Agent, AgentKey
from policy.services import agent_create, agent_key_revoke


def test_create_agent_prints_a_key_once_and_stores_only_its_hash(db, capsys):
    call_command("create_agent", "cursor-laptop")
    key = capsys.readouterr().out.strip()
    try:
        assert key.startswith("sb_")
        stored = AgentKey.objects.get(agent__name="cursor-laptop")
        secret = key.split("_", 2)[2]
        assert stored.digest == hashlib.sha256(secret.encode()).hexdigest()
        assert secret not in str(AgentKey.objects.filter(pk=stored.pk).values().first())
        assert snapshot_compile().key_holder(key).agent_name == "cursor-laptop"
        assert snapshot_compile().key_holder(key[:-2] + ("xx" if not key.endswith("xx") else "yy")) is None
    finally:
        Agent.objects.filter(name="cursor-laptop").delete()


def test_create_agent_refuses_a_duplicate_name(db):
    from django.core.management.base import CommandError

    call_command("create_agent", "dup")
    try:
        try:
            call_command("create_agent", "dup")
        except CommandError as exc:
            assert str(exc) == "An agent named 'dup' already exists."
        else:
            raise AssertionError("a second agent with the same name was created")
    finally:
        Agent.objects.filter(name="dup").delete()


def test_a_revoked_key_no_longer_authenticates(db):
    issued = agent_create(name="short-lived")
    try:
        assert snapshot_compile().key_holder(issued.key).agent_name == "short-lived"
        agent_key_revoke(prefix=issued.key.split("_")[1])
        assert snapshot_compile().key_holder(issued.key) is None
    finally:
        Agent.objects.filter(name="short-lived").delete()
