"""A per-person stdio upstream: each person's token in the environment of a process of their own, pooled across
their calls; at most GATEWAY_PERSON_PROCESSES at once, the least recently used idle one making room, and a
specific refusal when every one is busy."""

import json
import sys

import anyio
import pytest
from django.contrib.auth import get_user_model

from policy.models import Agent
from policy.services import agent_key_issue
from registry.personal import personal_connect
from tests import servers
from tests.clients import sdk_client, tool_names
from tests.factories import person_upstream
from tests.helpers import audit_mark, audit_since, eventually, until

pytestmark = pytest.mark.e2e

TOKENS = {"ana": "tok-ana-6b1f0e2d9c", "ben": "tok-ben-2a7d5c3e81"}
SCRIPT = str(servers.ROOT / "tests/support/protected_upstream.py")


@pytest.fixture(scope="module")
def desk(server_env, logs, tmp_path_factory) -> dict:
    """The stdio upstream, per person (env:UPSTREAM_TOKEN), and a gateway that runs one process per upstream
    for its people at most. Its sandbox is given a folder where the tests release its `hold` calls."""
    spec = ",".join(f"{person}:{token}" for person, token in TOKENS.items())
    releases = tmp_path_factory.mktemp("releases")
    releases.chmod(0o755)
    stdio = {"command": sys.executable, "args": [SCRIPT, "stdio", "--tokens", spec]}
    stdio["sandbox"] = {"paths": [str(releases)]}
    upstream = person_upstream("desk", TOKENS["ana"], transport="stdio", person_slot="env:UPSTREAM_TOKEN", **stdio)
    agent = Agent.objects.get_or_create(name="people")[0]
    users = {name: get_user_model().objects.create_user(f"{name}-stdio", first_name=name.title()) for name in TOKENS}
    keys = {name: agent_key_issue(agent=agent, owner=user, actor="tests").key for name, user in users.items()}
    try:
        with servers.inline_gateway_with(
            server_env, logs / "gateway-person-stdio.log", GATEWAY_PERSON_PROCESSES="1"
        ) as gw:
            for name, user in users.items():
                personal_connect(
                    upstream=upstream,
                    issuer=gw.url,
                    subject=str(user.pk),
                    name=user.first_name,
                    kind="token",
                    values={"token": TOKENS[name]},
                )
            eventually(lambda: "desk__whoami" in anyio.run(tool_names, gw.url, keys["ana"]))
            yield {"gateway": gw, "keys": keys, "releases": releases}
    finally:
        upstream.delete()
        for user in users.values():
            user.delete()


def _answer(result) -> dict:
    return json.loads(result.content[0].text)


def test_each_person_gets_a_process_of_their_own_reading_their_token(desk):
    gateway, keys = desk["gateway"], desk["keys"]

    async def whoami(name: str) -> dict:
        async with sdk_client(gateway.url, keys[name], "legacy") as client:
            return _answer(await client.call_tool("desk__whoami", {}))

    ana, ana_again = anyio.run(whoami, "ana"), anyio.run(whoami, "ana")
    assert ana["person"] == "ana" and ana_again["process"] == ana["process"]  # pooled across her calls
    ben = anyio.run(whoami, "ben")
    assert ben["person"] == "ben" and ben["process"] != ana["process"]  # ana's idle process made room (the cap is 1)
    assert anyio.run(whoami, "ana")["process"] != ana["process"]


def test_when_every_process_is_busy_a_new_person_is_refused(desk):
    gateway, keys = desk["gateway"], desk["keys"]
    release = desk["releases"] / "release"
    mark = audit_mark()

    async def scenario() -> tuple[dict, str]:
        held: dict = {}
        async with sdk_client(gateway.url, keys["ana"], "legacy", timeout=30) as ana:

            async def holding() -> None:
                held.update(_answer(await ana.call_tool("desk__hold", {"until": str(release)})))

            async with anyio.create_task_group() as tg:
                tg.start_soon(holding)
                async with sdk_client(gateway.url, keys["ben"], "legacy") as ben:

                    async def refused() -> str:
                        result = await ben.call_tool("desk__whoami", {})
                        return result.content[0].text if result.is_error else ""

                    # Until ana's call holds the one process, ben's may still take it (and ana's then waits for it).
                    refusal = await until(refused, timeout=20)
                release.write_text("go")
        return held, refusal

    held, refusal = anyio.run(scenario)
    assert held["released"] is True and held["pid"]
    busy = "This service already runs as many processes for people as it may (1), all busy: try again soon."
    assert refusal == f"desk__whoami: {busy}"
    rows = eventually(lambda: [r for r in audit_since(mark) if r.error_code == "PERSON_PROCESSES_FULL"])
    assert rows[0].person_name == "Ben"
