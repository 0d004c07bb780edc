"""The `outbound` network's setup waits for what bwrap has not done yet when it says the sandbox's process id: the
process's user namespace maps its ids a moment later, and slirp4netns started in it before then fails ("setns
(CLONE_NEWNET): Operation not permitted"; CI's failures of tests/test_sandbox_network.py's not-root cases under
load). A slirp4netns that ends says why."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from registry.upstreams.outbound import _said, ids_mapped
from tests.helpers import until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="writing another namespace's id maps needs root"
)


def test_the_setup_waits_until_the_sandboxs_user_namespace_maps_its_ids():
    # A user namespace as bwrap's child has it just after it is made: no map yet.
    child = subprocess.Popen(["unshare", "--user", "cat"], stdin=subprocess.PIPE)
    try:
        proc = Path(f"/proc/{child.pid}")
        ours = os.readlink("/proc/self/ns/user")
        anyio.run(until, lambda: os.readlink(proc / "ns/user") != ours)  # unshare has run
        assert (proc / "gid_map").read_text() == ""

        async def waits() -> bool:
            with anyio.move_on_after(0.3):
                await ids_mapped(child.pid)
                return True
            return False

        assert anyio.run(waits) is False
        (proc / "uid_map").write_text("0 65534 1\n")
        (proc / "setgroups").write_text("deny\n")
        (proc / "gid_map").write_text("0 65534 1\n")

        async def returns() -> None:
            with anyio.fail_after(5):
                await ids_mapped(child.pid)

        anyio.run(returns)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    ("script", "said"),
    [("echo 'setns(CLONE_NEWNET): nope' >&2", "setns(CLONE_NEWNET): nope"), ("", "(nothing on its standard error)")],
)
def test_a_process_that_ended_says_what_it_wrote_on_its_standard_error(script, said):
    async def ended() -> str:
        async with await anyio.open_process([sys.executable, "-c", f"import os; os.system({script!r})"]) as process:
            await process.wait()
            return await _said(process)

    assert anyio.run(ended) == said
