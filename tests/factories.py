"""Small factories for committed test data (the gateways under test read it from another process), each
removed again by its context manager."""

import itertools
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from policy.limits.admission import Admission, AgentLimits, TeamLimits, UpstreamLimits
from policy.models import Agent, ServerGroup, Team
from policy.services import agent_create
from registry.models import Upstream
from registry.services import upstream_catalog_sync, upstream_save
from registry.upstreams.sandbox import SandboxSettings
from registry.upstreams.spec import UpstreamSpec
from tests import servers

DEMO = [str(servers.ROOT / "examples/demo_upstream.py")]
# What a sandboxed demo server is given: the folders where it marks its `sleep` calls, for the tests to see.
DEMO_MARKS = [f"{servers.STARTED_DIR}:rw", f"{servers.CANCELLED_DIR}:rw"]
# How the pool reaches the demo server over stdio, for tests that drive the pool in this process.
DEMO_SPEC = UpstreamSpec(
    id=1,
    revision=1,
    slug="demo",
    transport="stdio",
    timeout=5,
    command=sys.executable,
    args=DEMO,
    sandbox=SandboxSettings(paths=tuple(DEMO_MARKS)),
)


def demo_sandbox(env: dict[str, str] | None = None) -> dict[str, Any]:
    """A demo server's sandbox setting: its marks' folders, and the folder of its DEMO_MANIFEST (a test may write
    the file later), opened to the unprivileged uid it runs as under root (pytest makes its folders 0700)."""
    if manifest := (env or {}).get("DEMO_MANIFEST"):
        os.chmod(os.path.dirname(manifest), 0o755)
        return {"paths": [*DEMO_MARKS, os.path.dirname(manifest)]}
    return {"paths": DEMO_MARKS}


def wrapped_sandbox() -> dict[str, Any]:
    """The sandbox setting of a demo server started by a script of a test's (`exec python demo_upstream.py`): the
    script is the command, so the interpreter and the server's file are given by hand."""
    return {"paths": [*DEMO_MARKS, sys.prefix, sys.base_prefix, DEMO[0]]}


def stdio_upstream(slug: str, command: str, args: list[str], **fields: Any) -> Upstream:
    """A stdio upstream, saved through the service and with its catalog synced."""
    upstream = Upstream(slug=slug, transport="stdio", command=command, args=args, **fields)
    upstream.full_clean()
    upstream_save(upstream=upstream, created=True)
    report = upstream_catalog_sync(upstream=upstream)
    assert report.ok, report.summary()
    return upstream


@contextmanager
def demo_upstream(slug: str, **fields: Any) -> Iterator[Upstream]:
    fields.setdefault("sandbox", demo_sandbox(fields.get("env")))
    upstream = stdio_upstream(slug, sys.executable, fields.pop("args", DEMO), **fields)
    try:
        yield upstream
    finally:
        upstream.delete()


@contextmanager
def agent(name: str, **fields: Any) -> Iterator[tuple[Agent, str]]:
    """An agent (with optional limits) and its API key."""
    issued = agent_create(name=name)
    for field, value in fields.items():
        setattr(issued.agent, field, value)
    issued.agent.save()
    try:
        yield issued.agent, issued.key
    finally:
        issued.agent.delete()


@contextmanager
def team(slug: str, **limits: Any) -> Iterator[Team]:
    """A team (with optional limits); whatever the test gave it is removed first."""
    made = Team.objects.create(slug=slug, name=slug.title(), **limits)
    try:
        yield made
    finally:
        Agent.objects.filter(team=made).delete()
        Upstream.objects.filter(team=made).delete()
        made.delete()


_ids = itertools.count(int(time.time()) % 1_000_000 * 1000)


def admission(*, agent: dict[str, Any] | None = None, **upstream: Any) -> Admission:
    """A call's claim on admission state, with ids no other test uses; `agent` and the keywords change the
    agent's and the upstream's limits."""
    unique = next(_ids)
    limits = UpstreamLimits(
        id=unique,
        slug="up",
        strict_group=None,
        group_name="",
        calls_per_minute=100,
        max_concurrent=100,
        breaker_failures=2,
        breaker_recovery=0.3,
        probe_seconds=5.0,
    )
    agent_limits = replace(AgentLimits(calls_per_minute=100, max_calls_per_session=100), **(agent or {}))
    return Admission(f"r{unique}", f"s{unique}", unique, agent_limits, replace(limits, **upstream))


def team_limits(**fields: Any) -> TeamLimits:
    """A team's limits, with an id no other test uses; generous unless the keywords say otherwise."""
    unique = next(_ids)
    limits = TeamLimits(id=unique, slug=f"team-{unique}", calls_per_minute=100, max_concurrent=100, daily_calls=100)
    return replace(limits, **fields)


@contextmanager
def specialist_register(slug: str, url: str, *, route: bool = False, **route_fields: Any) -> Iterator[Upstream]:
    """A handoff-only HTTP upstream at `url`, with a handoff route of the same domain when `route`."""
    from handoff.models import HandoffRoute

    upstream = Upstream(slug=slug, transport="streamable_http", url=url, handoff_only=True)
    upstream.full_clean()
    upstream_save(upstream=upstream, created=True)
    if route:
        description = f"Questions for the {slug} specialist."
        HandoffRoute.objects.create(domain=slug, description=description, target=upstream, **route_fields)
    try:
        yield upstream
    finally:
        upstream.delete()


@contextmanager
def two_strict_groups() -> Iterator[None]:
    """Demo servers `secrets` (strict group vault) and `mailer` (strict group outbound)."""
    vault = ServerGroup.objects.create(name="vault", isolation="strict")
    outbound = ServerGroup.objects.create(name="outbound", isolation="strict")
    try:
        with demo_upstream("secrets", group=vault), demo_upstream("mailer", group=outbound):
            yield
    finally:
        vault.delete()
        outbound.delete()


def person_upstream(slug: str, catalog_token: str, **fields: Any) -> Upstream:
    """A per-person upstream saved through the service, its catalog synced through an administrator's own
    connection (`catalog_token`, a token of theirs the upstream knows)."""
    from registry.personal import personal_connect

    upstream = Upstream(slug=slug, per_person=True, **fields)
    upstream.full_clean()
    upstream_save(upstream=upstream, created=True)
    admin = {"issuer": "https://idp.example.com", "subject": f"{slug}-admin", "name": "Admin", "kind": "token"}
    upstream.catalog_credential = personal_connect(upstream=upstream, values={"token": catalog_token}, **admin)
    upstream_save(upstream=upstream)
    report = upstream_catalog_sync(upstream=upstream)
    assert report.ok, report.summary()
    return upstream


def unrouted_handoff_targets_removed() -> None:
    """The session's specialists (tests/conftest.py) leave `devops`, a handoff target with no route, which an
    mcpServers file cannot say: an exporting test removes it inside its own transaction, rolled back after it."""
    Upstream.objects.filter(handoff_only=True, handoff_routes__isnull=True).delete()
