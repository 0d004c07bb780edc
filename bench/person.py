"""What a per-person upstream costs per tools/call against a shared one. The same HTTP upstream
(examples/demo_upstream.py over Streamable HTTP, started here on 127.0.0.1) is configured twice:

- shared:     `shared`, one connection for everyone;
- per person: `mine`, per person, the person's pasted token put in `X-Person-Token` (which the demo upstream
              ignores, so both do the same upstream work), stored for the caller with `personal_connect`.

The caller is a person: a personal key owned by a Django user (as My account issues it), so both targets are
called by the same principal and the admission, policy and audit work is alike; what differs is the per-person
path: the web side reads the person's credential row once a call (`personal_state`, through `credential_for`)
and the request carries its reference; the executor keeps a connection per person (opened once, with the
values opened then). Calls go through the MCP layer's `call_tool` in-process, as bench/dispatch.py drives it
(audit on PostgreSQL, admission in Redis), shared and per person alternating call by call (which goes first
alternates too), with `credential_for` alone timed between them. Every round runs each executor in turn:
inline (this process's pool thread) and Celery (a worker started here, `-P threads -c 16`); the figures are
the medians over the rounds of each round's p50 and p95.

    bench/run person --calls 1000 --rounds 3                      # inline and Celery
    bench/run person --calls 1000 --rounds 3 --executors inline   # without the worker
"""

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import ARGUMENTS, setup_database  # noqa: E402  (bench/run.py: the same data and environment)

from tests import servers  # noqa: E402  (the process helpers the tests use)

HOST = b"127.0.0.1:8000"  # where the personal key's requests say they came: its owner's issuer
SLOT = "header:X-Person-Token"
TOKEN = "bench-person-token-5d1f0a"
TARGETS = {"shared": "shared__echo", "per person": "mine__echo"}
WARMUP = 20
UNLIMITED = 10**9


def scope(key: str) -> dict:
    headers = [(b"host", HOST), (b"authorization", f"Bearer {key}".encode())]
    return {"type": "http", "scheme": "http", "headers": headers, "query_string": b""}


def setup(url: str) -> str:
    """The two upstreams on `url`, the person with their personal key and their token stored for `mine`;
    returns the key."""
    setup_database()  # migrated, an empty audit trail
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from handoff.mcp.caller import public_base
    from policy.models import Agent
    from policy.services import agent_create, agent_key_issue
    from registry.models import Upstream
    from registry.personal import personal_connect
    from registry.services import upstream_catalog_sync, upstream_save

    Upstream.objects.filter(slug__in=("shared", "mine")).delete()
    Agent.objects.filter(name=settings.GATEWAY_AUTH_SERVER_AGENT).delete()
    get_user_model().objects.filter(username="bench-person").delete()
    common = {"transport": "streamable_http", "url": url, "internal": True, "calls_per_minute": UNLIMITED}
    shared = Upstream(slug="shared", **common)
    upstream_save(upstream=shared, created=True)
    mine = Upstream(slug="mine", per_person=True, person_connect="token", person_slot=SLOT, **common)
    mine.full_clean()
    upstream_save(upstream=mine, created=True)
    admin = {"issuer": "https://idp.example.com", "subject": "admin", "name": "Admin", "kind": "token"}
    mine.catalog_credential = personal_connect(upstream=mine, values={"token": TOKEN}, **admin)
    upstream_save(upstream=mine)
    for upstream in (shared, mine):
        assert upstream_catalog_sync(upstream=upstream).ok
    agent = agent_create(name=settings.GATEWAY_AUTH_SERVER_AGENT).agent
    Agent.objects.filter(pk=agent.pk).update(calls_per_minute=UNLIMITED, max_calls_per_session=UNLIMITED)
    user = get_user_model().objects.create_user("bench-person", first_name="Bench")
    person = {"issuer": public_base(scope("")), "subject": str(user.pk), "name": "Bench"}
    personal_connect(upstream=mine, kind="token", values={"token": TOKEN}, **person)
    return agent_key_issue(agent=agent, owner=user, actor="bench").key


def use_executor(name: str) -> None:
    """The executor `call_tool` uses from now on (registry/executor.py builds it once from the setting)."""
    from celery import current_app
    from django.conf import settings

    from registry.executor import get_executor

    settings.GATEWAY_EXECUTOR = name
    get_executor.cache_clear()
    if name == "celery":  # the task definitions it publishes by name, as the web process has them imported
        current_app.loader.import_default_modules()


async def measure(key: str, executors: list[str], calls: int, rounds: int) -> dict:
    """{executor: {what: [one list of ms per round]}}"""
    from mcp import types

    from handoff.mcp.caller import caller_from_scope
    from handoff.mcp.personal_access import credential_for
    from handoff.mcp.tools import call_tool
    from handoff.snapshot import snapshot

    caller = await caller_from_scope(scope(key), "http")
    assert caller.person_subject, "the personal key names nobody"
    # A 2025-11-25 request of a client that declared nothing and asked for no progress: no relay is carried.
    session = SimpleNamespace(client_capabilities=None)
    ctx = SimpleNamespace(
        request=caller, request_id=1, protocol_version="2025-11-25", session=session, params={}, meta=None
    )
    params = {what: types.CallToolRequestParams(name=name, arguments=ARGUMENTS) for what, name in TARGETS.items()}
    route = (await snapshot.get()).tools[TARGETS["per person"]].route

    async def call(what: str) -> float:
        started = time.perf_counter()
        result = await call_tool(ctx, params[what])
        elapsed = (time.perf_counter() - started) * 1000
        assert not result.get("isError"), result
        return elapsed

    async def lookup() -> float:
        started = time.perf_counter()
        ref = await credential_for(caller, route, TARGETS["per person"])
        elapsed = (time.perf_counter() - started) * 1000
        assert ref.id, ref  # a CredentialRef, not a refusal
        return elapsed

    times = {name: {what: [] for what in [*TARGETS, "credential_for"]} for name in executors}
    for round_ in range(rounds):
        for name in executors:
            use_executor(name)
            for _ in range(WARMUP):  # the connections (one shared, one the person's), the clients, the pools
                for what in TARGETS:
                    await call(what)
            taken = {what: [] for what in times[name]}
            for n in range(calls):
                order = list(TARGETS) if n % 2 == 0 else list(reversed(TARGETS))
                for what in order:
                    taken[what].append(await call(what))
                taken["credential_for"].append(await lookup())
            for what, values in taken.items():
                times[name][what].append(values)
            shared, person = (statistics.median(taken[what]) for what in TARGETS)
            print(f"round {round_ + 1} {name}: p50 shared {shared:.3f} ms, per person {person:.3f} ms", file=sys.stderr)
    return times


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18]


def table(times: dict) -> str:
    lines = [
        "| executor | what | p50 ms, each round | p50 ms | p95 ms | p50 / shared | p95 / shared |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for name, by_what in times.items():
        medians = {what: statistics.median(statistics.median(r) for r in rounds) for what, rounds in by_what.items()}
        tails = {what: statistics.median(p95(r) for r in rounds) for what, rounds in by_what.items()}
        for what, rounds in by_what.items():
            each = ", ".join(f"{statistics.median(r):.3f}" for r in rounds)
            ratios = (
                "| |"
                if what == "credential_for"
                else (f"| {medians[what] / medians['shared']:.3f} | {tails[what] / tails['shared']:.3f} |")
            )
            lines.append(f"| {name} | {what} | {each} | {medians[what]:.3f} | {tails[what]:.3f} {ratios}")
        added = statistics.median(
            statistics.median(b - a for a, b in zip(r_a, r_b, strict=True))
            for r_a, r_b in zip(by_what["shared"], by_what["per person"], strict=True)
        )
        lines.append(f"| {name} | per person − shared, per pair | | {added:.3f} | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per target, executor and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--executors", default="inline,celery")
    parser.add_argument("--logs", type=Path, default=ROOT / "bench/results")
    args = parser.parse_args()
    executors = args.executors.split(",")
    args.logs.mkdir(parents=True, exist_ok=True)
    started = [servers.start_demo_http(args.logs / "person-upstream.log")]
    try:
        key = setup(started[0].url)
        if "celery" in executors:
            env = dict(os.environ) | {"GATEWAY_EXECUTOR": "celery"}
            started.append(servers.start_worker(env, args.logs / "person-worker.log"))
        times = asyncio.run(measure(key, executors, args.calls, args.rounds))
        if "inline" in executors:  # its connections end before their upstream does, not under it
            from registry.upstreams.loop import pool_thread

            pool_thread().stop()
    finally:
        for running in reversed(started):
            running.stop()
    print(table(times))


if __name__ == "__main__":
    main()
