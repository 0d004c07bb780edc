"""A stdio server's `outbound` network (registry/upstreams/outbound.py) reaches the internet and nothing the egress
guard refuses: run inside network namespaces this test makes (no packet leaves the machine), where a test host
stands in for the internet (a global address), with a cloud's metadata address and a private network beside it,
and the "host" has a global address of its own and a service on its loopback."""

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

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


def probed(host: str, *internal: str) -> dict:
    hosts = [[INTERNET, PORT], [METADATA, PORT], [PRIVATE, PORT], [HOST, PORT], ["10.0.2.2", PORT]]
    found = {"files": [], "tcp": [PORT], "sockets": [], "write": [], "processes": [], "hosts": hosts}
    command = ["ip", "netns", "exec", host, sys.executable, "-m", "tests.support.outbound_probe", json.dumps(found)]
    done = subprocess.run([*command, *internal], cwd=servers.ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_an_outbound_server_reaches_the_internet_and_not_metadata_private_ranges_or_the_host(world):
    seen = probed(world)
    assert (seen["hosts"], seen["tcp"]) == ([f"{INTERNET}:{PORT}"], [])


def test_an_internal_upstreams_outbound_server_also_reaches_private_ranges_never_the_hosts_loopback(world):
    seen = probed(world, "internal")
    assert seen["hosts"] == [f"{INTERNET}:{PORT}", f"{METADATA}:{PORT}", f"{PRIVATE}:{PORT}", f"{HOST}:{PORT}"]
    assert seen["tcp"] == []
