"""Small factories for committed test data (the gateways under test read it from another process), each
removed again by its context manager."""

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from policy.models import Agent
from policy.services import agent_create
from registry.models import Upstream
from registry.services import upstream_catalog_sync, upstream_save
from tests import servers

DEMO = [str(servers.ROOT / "examples/demo_upstream.py")]


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
