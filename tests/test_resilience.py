"""A hanging or failing upstream is contained: every call is bounded by its upstream's timeout (which progress
notifications do not extend, and which has a hard maximum); repeated failures open the upstream's circuit,
shared by every process, so further calls are refused at once; after about a second one probe goes through
and, if the upstream answers (a killed stdio server is restarted for it), closes it; each failed probe doubles
the pause, up to the recovery time. Other upstreams never notice."""

import os
import signal
from typing import Any

import anyio
import pytest
from django.core.exceptions import ValidationError
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from audit.models import AuditEvent
from registry.models import Upstream
from tests.clients import call, circuit, sdk_client, tool_names
from tests.factories import demo_upstream
from tests.helpers import audit_mark, audit_since, eventually, orm, run, server_pid


def test_progress_notifications_do_not_extend_an_upstreams_timeout(gateway, world):
    mark = audit_mark()
    result = run(lambda: call(gateway.url, world.key, "slow__progress", {"seconds": 4}))
    assert result.is_error
    assert result.content[0].text == "slow__progress: The service did not answer within 1 seconds."
    # Only this call's rows: a row another test's gateway writes late is not this call's.
    [completed] = [r for r in audit_since(mark) if r.kind == "completed" and r.exposed_name == "slow__progress"]
    assert (completed.outcome, completed.error_code) == ("timeout", "UPSTREAM_TIMEOUT")


def test_a_timeout_past_the_deployments_maximum_is_refused():
    upstream = Upstream(slug="patient", transport="stdio", command="x", timeout=301)
    with pytest.raises(ValidationError) as refused:
        upstream.full_clean(exclude=["group"])
    assert refused.value.message_dict["timeout"] == ["Ensure this value is less than or equal to 300.0."]


def test_a_hanging_upstream_opens_its_circuit_and_a_probe_closes_it_when_it_recovers(gateway, world, admin_token):
    with demo_upstream("flaky", timeout=0.5, breaker_failures=2, breaker_recovery=1.0):
        url, key = gateway.url, world.key
        eventually(lambda: "flaky__sleep" in run(lambda: tool_names(url, key)))
        mark = audit_mark()
        hung = [run(lambda: call(url, key, "flaky__sleep", {"seconds": 3})) for _ in range(2)]
        assert [r.content[0].text for r in hung] == ["flaky__sleep: The service did not answer within 0.5 seconds."] * 2
        assert circuit(gateway, "flaky", admin_token)["state"] == "open"
        refused = run(lambda: call(url, key, "flaky__echo", {"text": "anyone?"}))
        other = run(lambda: call(url, key, "demo__echo", {"text": "unaffected"}))
        # After the recovery time one probe goes through; the upstream answers it, which closes the circuit.
        probe = eventually(lambda: _answered(run(lambda: call(url, key, "flaky__echo", {"text": "back"}))))
        closed = circuit(gateway, "flaky", admin_token)
    assert isinstance(refused, MCPError) and (refused.code, refused.data["code"]) == (-32003, "UPSTREAM_CIRCUIT_OPEN")
    assert 0 < refused.data["retryAfter"] <= 1.0
    assert str(refused).startswith("The service 'flaky' failed repeatedly and is paused. Retry after ")
    assert other.content[0].text == "unaffected"
    assert probe.content[0].text == "back" and (closed["state"], closed["failures"]) == ("closed", 0)
    denied = [r.error_code for r in audit_since(mark) if r.kind == "denied" and r.upstream == "flaky"]
    assert denied and set(denied) == {"UPSTREAM_CIRCUIT_OPEN"}


def _answered(result):
    return None if isinstance(result, MCPError) else result


def test_a_failed_probe_opens_the_circuit_again(inline_gateway, world, admin_token):
    with demo_upstream("shaky", timeout=0.5, breaker_failures=1, breaker_recovery=0.5):
        url, key = inline_gateway.url, world.key
        eventually(lambda: "shaky__sleep" in run(lambda: tool_names(url, key)))
        run(lambda: call(url, key, "shaky__sleep", {"seconds": 3}))
        assert circuit(inline_gateway, "shaky", admin_token)["state"] == "open"
        eventually(lambda: circuit(inline_gateway, "shaky", admin_token)["state"] == "half-open")
        probe = run(lambda: call(url, key, "shaky__sleep", {"seconds": 3}))
        after = circuit(inline_gateway, "shaky", admin_token)
    assert probe.content[0].text == "shaky__sleep: The service did not answer within 0.5 seconds."
    assert (after["state"], after["failures"]) == ("open", 2)


def test_a_stdio_upstream_killed_while_calls_run_serves_again_within_seconds(gateway, world):
    """Its circuit opens (the calls in flight failed), but first for about a second: the probe after it
    restarts the process, which answers."""
    # One failure opens its circuit (any call the kill breaks is one); recovery is the default 30 s.
    with demo_upstream("phoenix", breaker_failures=1):
        url, key = gateway.url, world.key
        eventually(lambda: "phoenix__pid" in run(lambda: tool_names(url, key)))
        said = run(lambda: call(url, key, "phoenix__pid")).content[0].text
        killed = server_pid(said)
        mark = audit_mark()
        back = run(lambda: _kill_while_calls_run(url, key, killed, mark))
        crashed = [r.error_code for r in audit_since(mark) if r.kind == "completed" and r.upstream == "phoenix"]
        assert isinstance(back, CallToolResult) and not back.is_error, f"not served 5 s after the kill: {back}"
        # By its host pid: a new PID namespace may take the number the killed server's freed (the lowest free
        # one), so what `pid` says can repeat.
        served_by = server_pid(back.content[0].text)
    assert "UPSTREAM_UNAVAILABLE" in crashed, crashed
    assert served_by != killed


async def _kill_while_calls_run(url: str, key: str, pid: int, mark: int) -> Any:
    """Kill the upstream while four calls run; then its first answer within 5 s of the kill, or the last
    refusal. A call that reached the restarted process would close the circuit, but only after 10 s."""

    def approved() -> int:
        return AuditEvent.objects.filter(id__gt=mark, kind="approved", exposed_name="phoenix__sleep").count()

    async def sleep() -> None:
        async with sdk_client(url, key, "legacy", timeout=15) as client:
            await client.call_tool("phoenix__sleep", {"seconds": 10})

    async with anyio.create_task_group() as calls:
        for _ in range(4):
            calls.start_soon(sleep)
        with anyio.fail_after(5):
            while await orm(approved) < 4:
                await anyio.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        answer = None
        with anyio.move_on_after(5):
            while isinstance(answer := await call(url, key, "phoenix__pid"), MCPError) or answer.is_error:
                await anyio.sleep(0.1)
        calls.cancel_scope.cancel()
    return answer


def test_an_upstream_that_keeps_failing_stays_paused_longer_after_each_failed_probe(gateway, world):
    with demo_upstream("sinking", timeout=0.5, breaker_failures=1):  # recovery: the default 30 s
        url, key = gateway.url, world.key
        eventually(lambda: "sinking__sleep" in run(lambda: tool_names(url, key)))
        failed = [run(lambda: call(url, key, "sinking__sleep", {"seconds": 3}))]
        waits = [_refused_for(url, key)]
        for _ in range(2):  # each probe goes through once the circuit is half-open, and times out
            failed.append(eventually(lambda: _answered(run(lambda: call(url, key, "sinking__sleep", {"seconds": 3})))))
            waits.append(_refused_for(url, key))
    assert [r.content[0].text for r in failed] == ["sinking__sleep: The service did not answer within 0.5 seconds."] * 3
    # Open for 1 s, then 2 s, then 4 s (GATEWAY_BREAKER_FIRST_OPEN_SECONDS doubled by each failed probe).
    assert 0 < waits[0] <= 1 < waits[1] <= 2 < waits[2] <= 4, waits


def _refused_for(url: str, key: str) -> float:
    refused = run(lambda: call(url, key, "sinking__echo", {"text": "anyone?"}))
    assert isinstance(refused, MCPError) and (refused.code, refused.data["code"]) == (-32003, "UPSTREAM_CIRCUIT_OPEN")
    return refused.data["retryAfter"]
