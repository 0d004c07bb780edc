"""Code mode through real gateways (both executors, both eras): `switchboard__search_tools` and
`switchboard__execute`, whose code's tool calls meet the same policy, isolation and audit as direct ones."""

import json
import os
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import anyio
import pytest
import redis
from mcp.shared.exceptions import MCPError

from policy.models import Rule
from registry.models import Upstream
from tests import servers
from tests.clients import call, sdk_client, tool_names, ws_session
from tests.conftest import needs
from tests.factories import agent, two_strict_groups
from tests.helpers import audit_mark, audit_since, eventually, run, until
from tests.otlp import CALLED, stages_of

SEARCH, EXECUTE = "switchboard__search_tools", "switchboard__execute"
MODES = ["legacy", "2026-07-28"]


def value_of(result) -> object:
    assert not result.is_error, result.content[0].text
    return json.loads(result.content[0].text)


def execute(gateway, key: str, code: str, mode: str = "legacy"):
    return run(lambda: call(gateway.url, key, EXECUTE, {"code": code}, mode))


@pytest.mark.parametrize("mode", MODES)
def test_code_calls_two_upstreams_and_combines_their_results(gateway, world, mode):
    code = """
        const now = await tools.time.getCurrentTime({ timezone: "Asia/Tokyo" });
        const [sum, echo] = await Promise.all([tools.demo.add({ a: 2, b: 3 }), tools.every.echo({ message: "hi" })]);
        console.log("zone", now.timezone);
        return { zone: now.timezone, sum, echo };
    """
    mark = audit_mark()
    result = execute(gateway, world.key, code, mode)
    assert value_of(result) == {"zone": "Asia/Tokyo", "sum": 5, "echo": "Echo: hi"}
    assert result.content[1].text == "console:\nzone Asia/Tokyo"
    rows = audit_since(mark)
    [approved, completed] = [row for row in rows if row.exposed_name == EXECUTE]
    assert (approved.kind, completed.kind, completed.outcome) == ("approved", "completed", "ok")
    assert approved.request_id == completed.request_id and approved.upstream == "switchboard"
    assert approved.detail["code_sha256"] and "arguments" not in approved.detail  # payloads are off here
    inner = [row for row in rows if row.exposed_name != EXECUTE]
    assert sorted((row.exposed_name, row.kind) for row in inner) == sorted(
        (name, kind)
        for name in ("time__get_current_time", "demo__add", "every__echo")
        for kind in ("approved", "completed")
    )
    assert {row.detail["execution"] for row in inner} == {str(approved.request_id)}
    assert all(row.outcome == "ok" for row in inner if row.kind == "completed")


def test_each_call_code_makes_runs_a_direct_calls_stages_inside_the_execute_stage(gateway, world, traces):
    code = """
        const sum = await tools.demo.add({ a: 1, b: 1 });
        return await tools.time.getCurrentTime({ timezone: "UTC" }) && sum;
    """
    mark = audit_mark()
    assert value_of(execute(gateway, world.key, code)) == 2
    [approved] = [row for row in audit_since(mark) if row.exposed_name == EXECUTE and row.kind == "approved"]
    assert stages_of(traces, approved.trace_id, calls=3) == {
        f"tools/call {EXECUTE}": CALLED,
        "tools/call demo__add": CALLED,
        "tools/call time__get_current_time": CALLED,
    }


def test_a_tool_error_is_caught_in_code_as_an_MCPToolError(gateway, world):
    code = """
        try {
            await tools.demo.fail({});
            return "not reached";
        } catch (e) {
            return { caught: e instanceof MCPToolError, name: e.name, code: e.code, tool: e.tool, message: e.message };
        }
    """
    assert value_of(execute(gateway, world.key, code)) == {
        "caught": True,
        "name": "MCPToolError",
        "code": "TOOL_ERROR",
        "tool": "demo__fail",
        "message": "this tool always fails",
    }


def test_an_uncaught_tool_error_ends_the_execution_with_an_error_result(inline_gateway, world):
    mark = audit_mark()
    result = execute(inline_gateway, world.key, "await tools.demo.fail({}); return 1;")
    assert result.is_error
    assert result.content[0].text == (f"{EXECUTE}: MCPToolError (TOOL_ERROR): this tool always fails")
    [completed] = [row for row in audit_since(mark) if row.exposed_name == EXECUTE and row.kind == "completed"]
    assert (completed.outcome, completed.error_code) == ("error", "CODE_ERROR")


def test_the_strict_group_lock_holds_inside_one_execution(gateway, world):
    code = """
        const secret = await tools.secrets.echo({ text: "the vault's secret" });
        try {
            await tools.mailer.echo({ text: secret });
            return "leaked";
        } catch (e) {
            return [e.code, e.message];
        }
    """
    with two_strict_groups():
        eventually(lambda: {"secrets__echo", "mailer__echo"} <= run(lambda: tool_names(gateway.url, world.key)))
        mark = audit_mark()
        refused = value_of(execute(gateway, world.key, code))
    assert refused[0] == "POLICY_GROUP_ISOLATION"
    assert "'mailer__echo' (group 'outbound') is out of its reach" in refused[1]
    [denied] = [row for row in audit_since(mark) if row.kind == "denied"]
    assert (denied.exposed_name, denied.error_code) == ("mailer__echo", "POLICY_GROUP_ISOLATION")
    assert "execution" in denied.detail


def test_a_denied_tool_is_absent_from_search_and_refused_from_code(inline_gateway, world):
    demo = Upstream.objects.get(slug="demo")
    with agent("carol") as (carol, key):
        rule = Rule.objects.create(effect="deny", agent=carol, upstream=demo, tool_pattern="echo")
        try:
            eventually(lambda: "demo__add" in (n := run(lambda: tool_names(inline_gateway.url, key))) and n)
            eventually(lambda: "demo__echo" not in run(lambda: tool_names(inline_gateway.url, key)))
            found = run(lambda: call(inline_gateway.url, key, SEARCH, {"query": "echo text back", "k": 20}))
            mark = audit_mark()
            # Past the bindings too: a message written straight to the host naming the denied tool.
            forged = """
                const bound = typeof tools.demo.echo;
                const line = JSON.stringify({ t: "call", id: 1000, ns: "demo", fn: "echo", args: { text: "x" } });
                Deno.stdout.writeSync(new TextEncoder().encode(line + "\\n"));
                const added = await tools.demo.add({ a: 1, b: 1 });
                return { bound, added };
            """
            result = execute(inline_gateway, key, forged)
        finally:
            rule.delete()
    names = [tool["name"] for tool in found.structured_content["tools"]]
    assert names and "demo__echo" not in names and "every__echo" in names
    assert value_of(result) == {"bound": "undefined", "added": 2}
    assert not [row for row in audit_since(mark) if row.exposed_name == "demo__echo"], "it reached no upstream"


def test_a_rule_can_deny_execute_itself(inline_gateway, world):
    with agent("dana") as (dana, key):
        rule = Rule.objects.create(effect="deny", agent=dana, tool_pattern="execute")
        try:
            eventually(lambda: (n := run(lambda: tool_names(inline_gateway.url, key))) and EXECUTE not in n)
            names = run(lambda: tool_names(inline_gateway.url, key))
            mark = audit_mark()
            refused = run(lambda: call(inline_gateway.url, key, EXECUTE, {"code": "return 1;"}))
        finally:
            rule.delete()
    assert SEARCH in names and "demo__echo" in names
    assert isinstance(refused, MCPError) and (refused.code, refused.data["code"]) == (-32001, "POLICY_DENIED")
    [denied] = audit_since(mark)
    assert (denied.kind, denied.exposed_name, denied.upstream) == ("denied", EXECUTE, "switchboard")


@pytest.mark.parametrize("mode", MODES)
def test_executions_and_the_calls_their_code_makes_count_against_the_agents_rate_limit(gateway, world, mode):
    with agent("erin", calls_per_minute=3) as (_, key):
        eventually(lambda: EXECUTE in run(lambda: tool_names(gateway.url, key)))
        mark = audit_mark()
        first = execute(gateway, key, "return await tools.demo.add({ a: 1, b: 2 });", mode)  # two calls
        searched = run(lambda: call(gateway.url, key, SEARCH, {"query": "add"}, mode))  # the third
        refused = execute(gateway, key, "return 1;", mode)
    assert value_of(first) == 3 and not searched.is_error
    assert isinstance(refused, MCPError) and (refused.code, refused.data["code"]) == (-32003, "AGENT_RATE_LIMITED")
    assert str(refused).startswith("This agent may make 3 tool calls a minute. Retry after ")
    assert 0 < refused.data["retryAfter"] <= 60
    rows = [(r.kind, r.exposed_name) for r in audit_since(mark)]
    assert rows.count(("denied", EXECUTE)) == 1 and ("approved", "demo__add") in rows
    [denied] = [r for r in audit_since(mark) if r.kind == "denied"]
    assert (denied.upstream, denied.tool, denied.error_code) == ("switchboard", EXECUTE, "AGENT_RATE_LIMITED")


def test_search_finds_the_right_tool_with_its_typescript_signature(gateway, world):
    found = run(lambda: call(gateway.url, world.key, SEARCH, {"query": "current time in a timezone", "k": 3}))
    first = found.structured_content["tools"][0]
    assert first["name"] == "time__get_current_time"
    assert first["call"] == "tools.time.getCurrentTime"
    assert "tools.time.getCurrentTime(args: {" in first["signature"]
    assert "timezone: string;" in first["signature"]
    assert "// time__get_current_time\n" in found.content[0].text


def test_search_ranks_by_meaning_once_the_catalog_is_embedded(gateway, world):
    query = {"query": "what does the clock show in Paris right now", "k": 3}

    def semantic():
        found = run(lambda: call(gateway.url, world.key, SEARCH, query)).structured_content
        return found if found["ranking"] == "lexical+semantic" else None

    found = eventually(semantic, timeout=60)  # the embeddings are made in the background
    assert found["tools"][0]["name"] == "time__get_current_time"


def test_without_semantic_ranking_search_is_lexical(server_env, world, logs):
    with servers.inline_gateway_with(server_env, logs / "gateway-lexical.log", GATEWAY_SEARCH_SEMANTIC="0") as gw:
        found = run(lambda: call(gw.url, world.key, SEARCH, {"query": "current time in a timezone"}))
    assert found.structured_content["ranking"] == "lexical"
    assert found.structured_content["tools"][0]["name"] == "time__get_current_time"


@pytest.mark.parametrize(
    ("tool", "arguments", "code", "message"),
    [
        (SEARCH, {}, "INVALID_ARGUMENTS", "`query` must be a non-empty string of at most 1000 characters."),
        (SEARCH, {"query": "time", "k": 0}, "INVALID_ARGUMENTS", "`k` must be a whole number from 1 to 20."),
        (SEARCH, {"query": "time", "k": True}, "INVALID_ARGUMENTS", "`k` must be a whole number from 1 to 20."),
        (EXECUTE, {"code": "  "}, "INVALID_ARGUMENTS", "`code` must be a non-empty string of TypeScript."),
        (EXECUTE, {"code": 42}, "INVALID_ARGUMENTS", "`code` must be a non-empty string of TypeScript."),
    ],
)
def test_bad_arguments_are_refused_with_invalid_params_and_audited(
    inline_gateway, world, tool, arguments, code, message
):
    mark = audit_mark()
    refused = run(lambda: call(inline_gateway.url, world.key, tool, arguments))
    assert isinstance(refused, MCPError)
    assert (refused.code, refused.data["code"], str(refused)) == (-32602, code, message)
    approved, completed = audit_since(mark)
    assert (approved.kind, completed.kind, completed.error_code) == ("approved", "completed", code)


@pytest.fixture(scope="module")
def capped(server_env, world, logs) -> Iterator[servers.Running]:
    """A gateway with small sandbox caps, keeping argument payloads (so the code's text is audited)."""
    caps = {
        "GATEWAY_SANDBOX_MAX_CALLS": "3",
        # Room for the call-limit case's four calls on a slow machine (they took over 2 s once in CI).
        "GATEWAY_SANDBOX_TIMEOUT": "6",
        "GATEWAY_SANDBOX_HEAP_MB": "32",
        "GATEWAY_SANDBOX_MAX_OUTPUT_BYTES": "2000",
        "GATEWAY_SANDBOX_MAX_CODE_BYTES": "1000",
        "GATEWAY_AUDIT_PAYLOADS": "1",
    }
    with servers.inline_gateway_with(server_env, logs / "gateway-capped.log", **caps) as running:
        yield running


@pytest.mark.parametrize(
    ("code", "error", "message"),
    [
        ("for (let i = 0; i < 5; i++) await tools.demo.add({ a: i, b: 1 });", "SANDBOX_CALL_LIMIT",
         "The code made more than 3 tool calls; split the work across executions."),
        ("while (true) {}", "SANDBOX_TIMEOUT", "The code ran longer than 6 s; do less in one execution."),
        ("const a = []; while (true) a.push('x'.repeat(1000) + a.length);", "SANDBOX_MEMORY_LIMIT",
         "The code used more than 32 MB of heap; hold less at once."),
        ("const a = []; for (let i = 0; i < 50; i++) a.push(new Uint8Array(100_000_000).fill(1));", "CODE_ERROR",
         "RangeError: Array buffer allocation failed"),
        ("return 'x'.repeat(5000);", "SANDBOX_OUTPUT_LIMIT",
         "The code's output (its value and console lines) passed 2000 bytes; return less."),
        ("for (let i = 0; i < 100; i++) console.log('line', i, 'x'.repeat(30));", "SANDBOX_OUTPUT_LIMIT",
         "The code's output (its value and console lines) passed 2000 bytes; return less."),
        ("const x: number = ;", "CODE_ERROR", "error: SyntaxError: Expression expected\n    at line 1, column 19"),
    ],
)  # fmt: skip
def test_each_sandbox_cap_ends_the_execution_with_its_own_error(capped, world, code, error, message):
    mark = audit_mark()
    result = execute(capped, world.key, code)
    assert result.is_error and result.content[0].text == f"{EXECUTE}: {message}"
    rows = [row for row in audit_since(mark) if row.exposed_name == EXECUTE]
    approved, completed = rows
    assert approved.detail["arguments"] == {"code": code}, "payloads on: the code's text is kept"
    assert (completed.outcome, completed.error_code) == ("error", error)


def test_code_over_the_size_cap_is_refused_before_it_runs(capped, world):
    refused = run(lambda: call(capped.url, world.key, EXECUTE, {"code": "return 1;" + " " * 1000}))
    assert isinstance(refused, MCPError) and (refused.code, refused.data["code"]) == (-32602, "CODE_TOO_LARGE")
    assert str(refused) == "`code` is larger than 1000 bytes; split the work into several executions."


@pytest.fixture(scope="module")
def two_sandboxes(server_env, world, logs) -> Iterator[servers.Running]:
    """A gateway that runs two executions at once, one per agent."""
    caps = {"GATEWAY_SANDBOX_MAX_RUNNING": "2", "GATEWAY_SANDBOX_MAX_RUNNING_PER_AGENT": "1"}
    with servers.inline_gateway_with(server_env, logs / "gateway-two-sandboxes.log", **caps) as running:
        yield running


SLOW = "await tools.demo.sleep({ seconds: 3, mark: 'busy' }); return 1;"


def while_running(gateway, slow_keys: list[str], key: str) -> tuple[list, object]:
    """Executions of SLOW under `slow_keys`, and, once all of them are running, one quick one under `key`."""
    started = audit_mark()

    def sleeping() -> bool:
        rows = [r for r in audit_since(started) if r.exposed_name == "demo__sleep" and r.kind == "approved"]
        return len(rows) == len(slow_keys)

    async def scenario():
        slow: list = []
        async with anyio.create_task_group() as tg:
            for slow_key in slow_keys:

                async def run_slow(slow_key=slow_key):
                    slow.append(await call(gateway.url, slow_key, EXECUTE, {"code": SLOW}))

                tg.start_soon(run_slow)
            await anyio.to_thread.run_sync(eventually, sleeping)
            quick = await call(gateway.url, key, EXECUTE, {"code": "return 2;"})
        return slow, quick

    return run(scenario)


def test_an_agent_runs_at_most_its_share_of_the_sandboxes_and_others_still_run(two_sandboxes, world):
    with agent("olga") as (_, other):
        eventually(lambda: EXECUTE in run(lambda: tool_names(two_sandboxes.url, other)))
        mark = audit_mark()
        [first], second = while_running(two_sandboxes, [world.key], world.key)
        [_], others = while_running(two_sandboxes, [world.key], other)
    assert value_of(first) == 1 and value_of(others) == 2, "another agent takes the free sandbox"
    assert second.is_error and second.content[0].text == (
        f"{EXECUTE}: This agent is running as many executions as it may at once here (1); retry when one has finished."
    )
    codes = [r.error_code for r in audit_since(mark) if r.exposed_name == EXECUTE and r.kind == "completed"]
    assert sorted(codes) == ["", "", "", "SANDBOX_AGENT_LIMIT"]


def test_an_execution_beyond_the_running_cap_is_refused_until_a_sandbox_is_free(two_sandboxes, world):
    with agent("pia") as (_, second), agent("quinn") as (_, third):
        for key in (second, third):
            eventually(lambda key=key: EXECUTE in run(lambda: tool_names(two_sandboxes.url, key)))
        mark = audit_mark()
        slow, refused = while_running(two_sandboxes, [world.key, second], third)
        assert value_of(execute(two_sandboxes, third, "return 3;")) == 3, "the slots were given back"
    assert [value_of(result) for result in slow] == [1, 1]
    assert refused.is_error and refused.content[0].text == (
        f"{EXECUTE}: No sandbox is free (at most 2 executions run at once here); retry in a few seconds."
    )
    codes = [r.error_code for r in audit_since(mark) if r.exposed_name == EXECUTE and r.kind == "completed"]
    assert sorted(codes) == ["", "", "", "SANDBOX_BUSY"]


ESCAPES = {
    "network": ("await fetch('http://127.0.0.1:5432/');", 'NotCapable: Requires net access to "127.0.0.1:5432"'),
    "file system": ("Deno.readTextFileSync('{canary}');", "NotCapable: Requires read access to"),
    "fetch a file": ("await fetch('file://{canary}');", "NotCapable: Requires read access to"),
    "environment": ("Deno.env.get('SECRET_KEY');", 'NotCapable: Requires env access to "SECRET_KEY"'),
    "subprocess": ("new Deno.Command('/bin/ls').outputSync();", 'NotCapable: Requires run access to "/bin/ls"'),
    "Deno.run": ("(Deno as any).run({ cmd: ['/bin/ls'] });", 'NotCapable: Requires run access to "/bin/ls"'),
    "eval": ("eval(\"Deno.readTextFileSync('{canary}')\");", "NotCapable: Requires read access to"),
    "Function": ('new Function("return Deno.env.toObject()")();', "NotCapable: Requires env access"),
    "node:fs": ("const fs = await import('node:fs'); fs.readFileSync('{canary}');", "Requires read access to"),
    # Deno loads local modules without read permission: the sandbox's import map sends them nowhere.
    "import a module": ("await import('file://{module}');", '"file:///nonexistent-module/'),
    "import JSON": ("await import('{json}', { with: { type: 'json' } });", "/nonexistent-module/"),
    "import relatively": ("await import('../../../../../../..{module}');", "/nonexistent-module/"),
    "eval an import": ("await eval(\"import('{module}')\");", "/nonexistent-module/"),
    "Object.prototype": ("(Object.prototype as any).isAdmin = true;", "TypeError: Cannot add property isAdmin"),
    "tools.__proto__": ("(tools as any).__proto__.polluted = 1;", "TypeError: Cannot set properties of undefined"),
    "binding": ("(tools.demo as any).add = () => 'forged';", "TypeError: Cannot assign to read only property"),
}


@pytest.mark.parametrize("attempt", ESCAPES)
def test_attempts_to_leave_the_sandbox_fail_inside_it(inline_gateway, world, tmp_path, attempt):
    canary, module, json_file = tmp_path / "canary.txt", tmp_path / "canary.ts", tmp_path / "canary.json"
    canary.write_text("canary-5f1e0c")
    module.write_text('export default "canary-5f1e0c";')
    json_file.write_text('{"canary": "canary-5f1e0c"}')
    statement, expected = ESCAPES[attempt]
    attempt_code = statement.replace("{canary}", str(canary)).replace("{module}", str(module))
    attempt_code = attempt_code.replace("{json}", str(json_file))
    code = f"try {{ {attempt_code} return 'escaped'; }} catch (e) {{ return `${{e.name}}: ${{e.message}}`; }}"
    text = execute(inline_gateway, world.key, code).content[0].text
    assert expected in text and "canary-5f1e0c" not in text


def test_nothing_an_execution_stores_reaches_the_next_one(inline_gateway, world):
    keep = """
        localStorage.setItem("left", "behind");
        await (await caches.open("c")).put("http://x/", new Response("behind"));
        return localStorage.getItem("left");
    """
    look = """
        const cached = await (await caches.open("c")).match("http://x/");
        return [localStorage.length, cached ? await cached.text() : null];
    """
    assert execute(inline_gateway, world.key, keep).content[0].text == "behind", "a string comes back as it is"
    assert value_of(execute(inline_gateway, world.key, look)) == [0, None]


@pytest.mark.parametrize(("mode", "listed"), [("only", False), ("off", True), ("on", True)])
def test_code_mode_settings_choose_what_tools_list_offers(server_env, world, logs, mode, listed):
    with servers.inline_gateway_with(server_env, logs / f"gateway-code-{mode}.log", GATEWAY_CODE_MODE=mode) as gw:
        names = run(lambda: tool_names(gw.url, world.key))
        refused = run(lambda: call(gw.url, world.key, SEARCH, {"query": "time"}))
    assert ("time__get_current_time" in names) is listed
    assert ({SEARCH, EXECUTE} <= names) is (mode != "off")
    if mode == "off":
        assert isinstance(refused, MCPError) and refused.data["code"] == "TOOL_NOT_FOUND"
    else:
        assert refused.structured_content["tools"][0]["name"].startswith("time__")


def test_code_mode_over_websocket_is_the_same_tool(gateway, world):
    code = "return await tools.demo.add({ a: 20, b: 22 });"

    async def scenario():
        async with ws_session(gateway.url, world.key) as ws:
            return await ws.request("tools/call", {"name": EXECUTE, "arguments": {"code": code}})

    reply = run(scenario)
    assert reply["result"]["content"][0]["text"] == "42"


def test_execute_in_a_celery_gateway_runs_on_the_sandbox_queue(celery_gateway, celery_worker, world):
    code = "return await tools.demo.pid({});"
    result = execute(celery_gateway, world.key, code)
    assert not result.is_error
    assert b"handoff.run_code" in celery_worker.log.read_bytes()


def test_an_execution_whose_broker_is_unreachable_gets_a_gateway_error_and_its_completion(server_env, world, logs):
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set")
    broker = f"redis://127.0.0.1:{servers.free_port()}/0"
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "CELERY_BROKER_URL": broker}
    gateway = servers.start_gateway(env, logs / "gateway-code-no-broker.log")
    try:
        mark = audit_mark()
        failed = execute(gateway, world.key, "return 1;")
    finally:
        gateway.stop()
    assert failed.is_error and failed.content[0].text == (
        f"{EXECUTE}: The gateway failed while running this code; its tool calls may or may not have run."
    )
    [completed] = [r for r in audit_since(mark) if r.kind == "completed"]
    assert completed.error_code == "GATEWAY_ERROR" and "ConnectionError" in completed.error_detail


def test_a_worker_runs_an_execution_on_no_older_configuration_than_the_gateway_that_sent_it(server_env, world, logs):
    """A worker that would look at the configuration only once an hour still binds a brand-new agent's tools:
    the execution names the version the gateway admitted it on."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Redis, so no Celery executor")
    own_redis = urlsplit(os.environ["REDIS_URL"])._replace(path="/11").geturl()
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "REDIS_URL": own_redis}
    worker = servers.start_worker(env | {"GATEWAY_SNAPSHOT_CHECK_SECONDS": "3600"}, logs / "worker-slow-to-look.log")
    gateway = servers.start_gateway(env, logs / "gateway-slow-worker.log")
    try:
        assert value_of(execute(gateway, world.key, "return 1;")) == 1  # the worker's snapshot is made now
        with agent("rosa") as (_, key):
            eventually(lambda: EXECUTE in run(lambda: tool_names(gateway.url, key)))
            added = execute(gateway, key, "return await tools.demo.add({ a: 2, b: 2 });")
        assert value_of(added) == 4
    finally:
        gateway.stop()
        worker.stop()
        redis.Redis.from_url(own_redis).flushdb()


def test_an_execution_no_worker_takes_is_reported_as_unavailable(server_env, world, logs):
    """A broker no worker of queue `sandbox` listens on: the wait ends after the sandbox's timeout and grace."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set")
    broker = urlsplit(os.environ["REDIS_URL"])._replace(path="/11").geturl()
    env = server_env | {"GATEWAY_EXECUTOR": "celery", "REDIS_URL": broker, "GATEWAY_SANDBOX_TIMEOUT": "1"}
    gateway = servers.start_gateway(env, logs / "gateway-code-workerless.log")
    try:
        mark = audit_mark()
        lost = execute(gateway, world.key, "return 1;")
    finally:
        gateway.stop()
        redis.Redis.from_url(broker).flushdb()  # the expired task nobody took
    assert lost.is_error and lost.content[0].text == (
        f"{EXECUTE}: No answer from the gateway's workers in time: the call may or may not have run. "
        "Check its effect before repeating it."
    )
    [completed] = [r for r in audit_since(mark) if r.kind == "completed"]
    assert completed.error_code == "EXECUTOR_UNAVAILABLE"


def test_an_agent_that_leaves_cancels_the_execution_and_the_calls_it_has_in_flight(gateway, world):
    mark, started = f"code-{uuid.uuid4().hex[:12]}", audit_mark()
    code = f"await tools.demo.sleep({{ seconds: 20, mark: '{mark}' }}); return 'not reached';"

    async def scenario():
        async with sdk_client(gateway.url, world.key, "legacy", timeout=30) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, EXECUTE, {"code": code})
                await until(lambda: servers.demo_started(mark), timeout=15)  # once the upstream runs its call
                tg.cancel_scope.cancel()

    run(scenario)
    assert eventually(lambda: os.path.exists(os.path.join(servers.CANCELLED_DIR, mark)), timeout=10), "upstream told"
    [completed] = eventually(
        lambda: [r for r in audit_since(started) if r.exposed_name == "demo__sleep" and r.kind == "completed"]
    )
    assert completed.error_code == "CANCELLED" and completed.detail["execution"]


def test_the_search_index_is_built_again_only_when_a_tool_changes():
    from handoff.codemode.run import search_index
    from handoff.snapshot import Snapshot
    from handoff.snapshot_tools import Route, ToolEntry
    from policy.decisions import Target, Who
    from tests.factories import admission

    limits = admission().upstream
    route, target = Route(1, "t", 1, 1.0, "a", limits), Target("t__a", "t", True, True, 1, None, "a")

    def snapshot_with(version: int, digest: str) -> Snapshot:
        entry = ToolEntry(route, target, {"name": "t__a", "description": "Say a."}, digest)
        return Snapshot(version, tools={"t__a": entry})

    who = Who(1)
    first = anyio.run(search_index, snapshot_with(1, "one"), who)
    assert anyio.run(search_index, snapshot_with(2, "one"), who) is first, "only keys or rules changed"
    assert anyio.run(search_index, snapshot_with(3, "two"), who) is not first, "the tool's definition changed"
