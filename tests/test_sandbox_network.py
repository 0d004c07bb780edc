"""A stdio server's `outbound` network (registry/upstreams/outbound.py) reaches the internet and nothing the egress
guard refuses: run inside network namespaces this test makes (no packet leaves the machine), where a test host
stands in for the internet (a global address), with a cloud's metadata address and a private network beside it,
and the "host" has a global address of its own and a service on its loopback. Each case runs as root and as a
non-root gateway (an unprivileged uid: bwrap then makes a user namespace, and slirp4netns and `ip` enter it)."""

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests import servers

INTERNET, HOST = "93.184.0.2", "93.184.0.1"  # global addresses, on this test's own link
METADATA, PRIVATE = "169.254.169.254", "10.99.0.2"
PORT = 8080
LISTEN = (
    "import socket, sys\n"
    "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
    "print('listening', flush=True)\n"
    "while True: s.accept()[0].close()\n"
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("slirp4netns"), reason="network namespaces are made as root"
)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def listen(namespace: str, address: str, port: int) -> subprocess.Popen:
    command = ["ip", "netns", "exec", namespace, sys.executable, "-c", LISTEN, address, str(port)]
    listener = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert listener.stdout.readline() == "listening\n"
    return listener


@pytest.fixture(scope="module")
def world() -> Iterator[str]:
    """Two namespaces: the "host" the gateway runs in, and the "internet" it reaches through a link of their own."""
    tag = secrets.token_hex(3)
    host, internet = f"sbhost{tag}", f"sbnet{tag}"
    ip("netns", "add", host)
    ip("netns", "add", internet)
    listeners = []
    try:
        ip("link", "add", f"h{tag}", "netns", host, "type", "veth", "peer", "name", f"n{tag}", "netns", internet)
        for namespace, link, address in ((host, f"h{tag}", HOST), (internet, f"n{tag}", INTERNET)):
            ip("-n", namespace, "address", "add", f"{address}/24", "dev", link)
            ip("-n", namespace, "link", "set", link, "up")
            ip("-n", namespace, "link", "set", "lo", "up")
        for extra in (METADATA, PRIVATE):
            ip("-n", internet, "address", "add", f"{extra}/32", "dev", f"n{tag}")
        ip("-n", host, "route", "add", "default", "via", INTERNET)
        listeners = [listen(internet, "0.0.0.0", PORT), listen(host, "0.0.0.0", PORT)]
        yield host
    finally:
        for listener in listeners:
            listener.kill()
            listener.wait()
        ip("netns", "delete", host)
        ip("netns", "delete", internet)


# Run by `ip netns exec`, in a mount namespace of its own: where the interpreter's installation lies in a folder
# closed to other users (these machines keep it under /root, mode 0700), a tmpfs over that folder with the
# installation bound back in (through a stage); then the rest as the unprivileged uid. Arguments: installation,
# closed folder, stage, uid.
UNPRIVILEGED = """
if [ -n "$2" ]; then
  mount --bind "$1" "$3" && mount -t tmpfs -o mode=0755 tmpfs "$2" && mkdir -p "$1" && mount --bind "$3" "$1"
fi
uid=$4 && shift 4 && exec setpriv --reuid="$uid" --regid="$uid" --clear-groups -- "$@"
"""


def _open(folder: Path) -> bool:
    """Whether other users may pass through `folder`."""
    return bool(os.stat(folder).st_mode & 0o001)


def as_user(user: str, own: str) -> list[str]:
    """The start of a command line that runs the rest as `user` (root, or not), with `own` its folder."""
    if user == "root":
        return []
    if closed_checkout := next((p for p in (servers.ROOT, *servers.ROOT.parents) if not _open(p)), None):
        pytest.skip(f"the checkout lies in {closed_checkout}, closed to other users: another uid cannot run it")
    installation = Path(os.path.realpath(sys.executable)).parent.parent
    closed = next((p for p in reversed(installation.parents) if not _open(p)), "")
    uid = str(settings.GATEWAY_STDIO_SANDBOX_UID)
    for folder in (f"{own}/home", f"{own}/var"):
        os.makedirs(folder)
        os.chown(folder, int(uid), int(uid))
    os.makedirs(stage := f"{own}/stage")
    env = [f"HOME={own}/home", f"TMPDIR={own}/home", f"SWITCHBOARD_VAR_DIR={own}/var"]
    return ["sh", "-c", UNPRIVILEGED, "sh", str(installation), str(closed), stage, uid, "env", *env]


def probed(host: str, *internal: str, user: str = "root") -> dict:
    hosts = [[INTERNET, PORT], [METADATA, PORT], [PRIVATE, PORT], [HOST, PORT], ["10.0.2.2", PORT]]
    found = {"files": [], "tcp": [PORT], "sockets": [], "write": [], "processes": [], "hosts": hosts}
    with tempfile.TemporaryDirectory() as own:
        os.chmod(own, 0o755)
        command = ["ip", "netns", "exec", host, *as_user(user, own), sys.executable, "-m"]
        command += ["tests.support.outbound_probe", json.dumps(found), *internal]
        done = subprocess.run(command, cwd=servers.ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert "hosts" in seen, seen  # else the call's failure: the server did not start
    return seen


@pytest.mark.parametrize("user", ["root", "not root"])
def test_an_outbound_server_reaches_the_internet_and_not_metadata_private_ranges_or_the_host(world, user):
    seen = probed(world, user=user)
    assert (seen["hosts"], seen["tcp"]) == ([f"{INTERNET}:{PORT}"], [])


@pytest.mark.parametrize("user", ["root", "not root"])
def test_an_internal_upstreams_outbound_server_also_reaches_private_ranges_never_the_hosts_loopback(world, user):
    seen = probed(world, "internal", user=user)
    assert seen["hosts"] == [f"{INTERNET}:{PORT}", f"{METADATA}:{PORT}", f"{PRIVATE}:{PORT}", f"{HOST}:{PORT}"]
    assert seen["tcp"] == []
