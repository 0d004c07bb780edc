"""Stdio servers started before the gateway's imports (registry/upstreams/prestart.py, as serve_demo's launcher starts
the demo's): the pool takes the one started as it would start it and owns it from then on; one that ended before it
was taken is reported and another started; one nothing takes is stopped."""

import logging
import os
import signal
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from registry.upstreams.health import Witness
from registry.upstreams.launch import server_start
from registry.upstreams.prestart import prestarted_discard, prestarted_take, servers_prestart
from registry.upstreams.spec import UpstreamSpec
from tests.factories import DEMO_SPEC
from tests.helpers import eventually, server_pid, transports_settle


def _start(spec: UpstreamSpec = DEMO_SPEC):
    return server_start(spec.slug, spec.command, spec.args, spec.env, spec.cwd, spec.sandbox)


def _lineage(pid: int) -> list[int]:
    """The process and its ancestors."""
    found = [pid]
    while found[-1] > 1:
        found.append(int(Path(f"/proc/{found[-1]}/stat").read_text().rsplit(")", 1)[1].split()[1]))
    return found


def _echo_and_lineage(spec: UpstreamSpec = DEMO_SPEC) -> tuple[str, list[int]]:
    """An echo and the serving process's lineage, from a session opened as the pool opens one; then the session
    closed."""

    async def scenario() -> tuple[str, list[int]]:
        witness = Witness()
        try:
            async with AsyncExitStack() as stack:
                client = await spec.connect(stack, witness)
                echoed = await client.call_tool("echo", {"text": "early"})
                said = await client.call_tool("pid", {})
                return echoed.content[0].text, _lineage(server_pid(said.content[0].text))
        finally:
            witness.close()
            await transports_settle()

    return anyio.run(scenario)


def test_the_pool_takes_the_server_started_early_as_it_would_start_it_and_ends_it_with_its_session(caplog):
    [early] = servers_prestart([_start()])
    with caplog.at_level(logging.INFO, logger="registry.upstreams.prestart"):
        echoed, lineage = _echo_and_lineage()
    assert echoed == "early"
    assert early.process.pid in lineage  # the confined server inside the launcher started early
    assert f"upstream demo: taking its server started early (pid {early.process.pid})" in caplog.text
    # Its session's end ended it, as a server the pool started itself: it is the pool's, not the launcher's.
    eventually(lambda: early.process.poll() is not None)
    assert prestarted_take(_start()) is None


def test_a_server_started_otherwise_is_not_taken_and_nothing_takes_it_twice(caplog):
    other = server_start("demo", DEMO_SPEC.command, DEMO_SPEC.args, {"DEMO_OTHER": "1"}, "", DEMO_SPEC.sandbox)
    [early] = servers_prestart([other])
    try:
        with caplog.at_level(logging.INFO, logger="registry.upstreams.prestart"):
            echoed, lineage = _echo_and_lineage()
        assert echoed == "early" and early.process.pid not in lineage
        assert "taking its server" not in caplog.text
        assert early.process.poll() is None  # still kept for the start it was made for
    finally:
        prestarted_discard([early])
    assert early.process.poll() is not None and prestarted_take(other) is None


def test_a_server_started_early_that_ended_before_it_was_taken_is_reported_and_another_started(caplog):
    [early] = servers_prestart([_start()])
    os.killpg(early.process.pid, signal.SIGKILL)
    eventually(lambda: early.process.poll() is not None)
    with caplog.at_level(logging.INFO, logger="registry.upstreams.prestart"):
        echoed, lineage = _echo_and_lineage()
    assert echoed == "early" and early.process.pid not in lineage
    assert (
        "upstream demo: its server, started early, was killed by SIGKILL before the pool took it; starting another"
    ) in caplog.text


def test_servers_started_early_that_nothing_takes_are_stopped():
    started = servers_prestart([_start()])
    prestarted_discard(started)
    assert [p.process.poll() for p in started] != [None] and prestarted_take(_start()) is None
