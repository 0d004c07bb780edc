"""The embedded default (scripts/demo's serve_demo: Daphne, SQLite) when another process holds its database's
write lock: the call's audit row waits SQLITE_TIMEOUT_SECONDS, then the call is refused with AUDIT_UNAVAILABLE
and never runs unrecorded; once the lock is gone the next call is served."""

import asyncio
import sqlite3

import pytest
from mcp.shared.exceptions import MCPError

from audit.services import canonical_sha256
from tests import servers
from tests.clients import sdk_client
from tests.test_audit_sqlite_writer import locked
from tests.test_demo_start import _serve

pytestmark = pytest.mark.e2e  # it runs serve_demo with its upstreams


async def echo(url: str, key: str, text: str) -> object:
    async with sdk_client(url, key, "2026-07-28") as client:  # stateless: no session row written first
        try:
            return await client.call_tool("demo__echo", {"text": text})
        except MCPError as refused:
            return refused


def test_a_call_on_a_database_locked_by_another_process_is_refused_and_never_runs_unrecorded(tmp_path, monkeypatch):
    monkeypatch.setenv("SQLITE_TIMEOUT_SECONDS", "0.5")
    var = tmp_path / "var"
    running, key = _serve(var, servers.free_port(), tmp_path / "demo.log")
    try:
        before = asyncio.run(echo(running.url, key, "before"))
        with locked(var / "switchboard.sqlite3"):
            refused = asyncio.run(echo(running.url, key, "locked"))
        after = asyncio.run(echo(running.url, key, "after"))
    finally:
        running.stop()
    assert [c.text for c in before.content] == ["before"] and [c.text for c in after.content] == ["after"]
    assert isinstance(refused, MCPError) and refused.code == -32002 and refused.data["code"] == "AUDIT_UNAVAILABLE"
    assert refused.message == "The gateway could not record this call, so it was not run. Try again shortly."
    assert "database is locked" in running.log.read_text()  # the writer's error, in the gateway's log
    with sqlite3.connect(var / "switchboard.sqlite3") as db:
        written = db.execute("SELECT kind, arguments_sha256 FROM audit_auditevent").fetchall()
    assert ("completed", canonical_sha256({"text": "after"})) in written
    assert canonical_sha256({"text": "locked"}) not in {r[1] for r in written}, "an unrecorded call must not run"
