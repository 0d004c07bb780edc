"""Upstream health: what the last sync, call or probe found, and why it failed in words for the operator.

The executor classifies each failure where it happens (registry/upstreams/pool.py) into a cause that is specific and
safe: the upstream's own credentials blanked, never a Python repr. The model keeps the generic message."""

import os
import ssl
from collections.abc import Callable
from typing import IO, Any

import httpx2

from registry.upstreams.egress import EgressRefused
from registry.upstreams.launch import stderr_file
from registry.upstreams.packages import PackageProblem
from registry.upstreams.sandbox import SandboxRefused
from registry.upstreams.scrub import blanked

STDERR_LINES = 5  # the last lines of a stdio server's stderr a cause quotes
STDERR_TAIL_BYTES = 2048
STDERR_KEPT_BYTES = 1 << 20  # past this a long-lived server's stderr file is cut back to its tail
CAUSE_CHARS = 1000
OK, FAILING = "ok", "failing"  # Upstream.Health's values (the pool stays free of the ORM)
COMMAND_NOT_FOUND = "command not found: "  # a cause that waiting will not cure (registry/services.py)


def found(exc: BaseException, wanted: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception `wanted` accepts wherever the transport's task groups and wrappers put it."""
    if wanted(exc):
        return exc
    inner = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else []
    inner += [e for e in (exc.__cause__, exc.__context__) if e is not None]
    return next((hit for e in inner if (hit := found(e, wanted))), None)


class Witness:
    """What one connection saw that its exceptions do not say: a stdio server's last stderr lines (written
    to a file of ours) and how its process ended, and the last HTTP error status."""

    def __init__(self, on_end: Callable[[], None] | None = None) -> None:
        self._stderr: IO[bytes] | None = None
        self.http_status: int | None = None
        self.ending = ""  # "exited with status 3": set when a stdio server's output ends before we stop it
        self._on_end = on_end  # told at once that the server ended (its connection, dead from then on)

    def ended(self, ending: str) -> None:
        self.ending = ending
        if self._on_end is not None:
            self._on_end()

    def errlog(self, kept: IO[bytes] | None = None) -> IO[bytes]:
        """Where its stdio server's stderr goes: `kept`, that of a server started before (prestart.py), if given."""
        if kept is not None:
            self.close()
            self._stderr = kept
        elif self._stderr is None:
            self._stderr = stderr_file()  # closed with the connection (`close`)
        return self._stderr

    def trim(self) -> None:
        """Cut a chatty server's stderr file back to its tail."""
        if self._stderr is None or self._stderr.closed:
            return
        fd = self._stderr.fileno()
        size = os.fstat(fd).st_size
        if size > STDERR_KEPT_BYTES:
            tail = os.pread(fd, STDERR_TAIL_BYTES, max(0, size - STDERR_TAIL_BYTES))
            os.ftruncate(fd, 0)
            os.write(fd, tail)

    async def heard(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self.http_status = response.status_code

    def stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return ""
        start = max(0, os.fstat(self._stderr.fileno()).st_size - STDERR_TAIL_BYTES)
        lines = os.pread(self._stderr.fileno(), STDERR_TAIL_BYTES, start).decode("utf-8", "replace").splitlines()
        lines = lines[1:] if start else lines  # the first may be cut
        return " | ".join([line.strip() for line in lines if line.strip()][-STDERR_LINES:])

    def close(self) -> None:
        if self._stderr is not None:
            self._stderr.close()


def _what_failed(exc: BaseException, spec: Any, witness: Witness) -> str:
    if refused := found(exc, lambda e: isinstance(e, EgressRefused)):
        return f"refused address: {refused}"
    if refused := found(exc, lambda e: isinstance(e, SandboxRefused | PackageProblem)):
        return f"not started: {refused}"
    if spec.transport == "stdio" and found(exc, lambda e: isinstance(e, FileNotFoundError)):
        return f"{COMMAND_NOT_FOUND}{spec.command}"
    if spec.transport == "stdio" and found(exc, lambda e: isinstance(e, PermissionError)):
        return f"command not executable: {spec.command}"
    if witness.http_status:
        return f"HTTP {witness.http_status} from {spec.url}"
    if tls := found(exc, lambda e: isinstance(e, ssl.SSLError)):
        return f"TLS error: {getattr(tls, 'reason', None) or tls}"
    if failed := found(exc, lambda e: isinstance(e, httpx2.TransportError | ConnectionError)):
        return f"could not connect to {spec.url}: {failed or type(failed).__name__}"
    if spec.transport == "stdio":
        return f"the server {witness.ending or 'closed its output'} during start-up"
    return f"connect failed: {type(exc).__name__}"


def command_missing(cause: str) -> bool:
    """Whether a stdio server could not start because its command does not exist where upstreams run."""
    return cause.startswith(COMMAND_NOT_FOUND)


def connect_cause(exc: BaseException, spec: Any, witness: Witness) -> str:
    """Why a connect failed, for the operator."""
    return with_stderr(_what_failed(exc, spec, witness), spec, witness)


def with_stderr(cause: str, spec: Any, witness: Witness) -> str:
    """The cause, with how a stdio server ended (when its words do not say) and its last stderr lines, the
    upstream's credentials blanked."""
    if witness.ending and witness.ending not in cause:
        cause = f"{cause}: the server {witness.ending}"
    tail = witness.stderr_tail()
    text = f"{cause}; stderr: {tail}" if tail else cause
    return blanked(text, spec.secrets)[:CAUSE_CHARS]


def outcome_health(outcome: dict[str, Any]) -> tuple[str, str] | None:
    """The health an outcome shows: an answer (a result or the upstream's JSON-RPC error) is ok, a failure
    with a cause is failing; anything else (a slow tool, a cancelled call) says nothing of the upstream."""
    if outcome.get("ok") or "rpc_code" in outcome:
        return OK, ""
    if cause := outcome.get("cause"):
        return FAILING, cause
    return None
