"""Runs the hostile server's probe in a pool, confined with an `outbound` network, and prints what it reached: run by
tests/test_sandbox_network.py inside a network namespace the test made (`ip netns exec`), where test hosts stand in
for the internet, a cloud's metadata address and a private network. Arguments: the probe's targets (JSON), and
`internal` to mark the upstream internal."""

import json
import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
django.setup()

from registry.upstreams.pool import UpstreamPool  # noqa: E402
from registry.upstreams.requests import UpstreamRequest  # noqa: E402
from registry.upstreams.sandbox import SandboxSettings  # noqa: E402
from registry.upstreams.spec import UpstreamSpec  # noqa: E402
from tests import servers  # noqa: E402
from tests.helpers import with_pool  # noqa: E402


async def probe(pool: UpstreamPool) -> dict:
    return await pool.request(UpstreamRequest.tool_call(1, 1, "probe", {}))


if __name__ == "__main__":
    sandbox = SandboxSettings(network="outbound", internal=sys.argv[2:] == ["internal"])
    spec = UpstreamSpec(
        id=1, revision=1, slug="outbound", transport="stdio", timeout=30, command=sys.executable,
        args=[str(servers.ROOT / "tests/support/hostile_server.py"), sys.argv[1]], sandbox=sandbox,
    )  # fmt: skip
    outcome = with_pool(spec, probe)
    print(json.dumps(json.loads(outcome["result"]["content"][0]["text"]) if outcome["ok"] else outcome))
