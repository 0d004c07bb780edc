"""How a stdio server starts (its command line, environment and folder, confined by its sandbox) and how its process
ended, in the operator's words. Free of the SDK and of Django's apps: serve_demo's launcher starts servers with it
before either is imported (registry/upstreams/prestart.py)."""

import os
import shutil
import signal
import tempfile
from contextlib import suppress
from dataclasses import dataclass
from typing import IO, Any

from django.conf import settings

from registry.upstreams.limits import Cgroup, cgroup_make, rlimits
from registry.upstreams.outbound import Outbound
from registry.upstreams.sandbox import HOME, SandboxSettings, bwrap_command

# What a server inherits of the gateway's environment, as the SDK's stdio client gives it (get_default_environment,
# which cannot be imported without the SDK's 0.5 s).
INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


@dataclass(frozen=True)
class ServerStart:
    """What a server's start is made of; two equal ones start the same server. `sandbox` None: unconfined."""

    slug: str
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str | None
    sandbox: SandboxSettings | None


def server_start(
    slug: str, command: str, args: list[str], env: dict[str, str], cwd: str, sandbox: SandboxSettings
) -> ServerStart:
    """How the pool starts an upstream's server: with PATH, so that commands like `npx` and `uvx` resolve as they
    would in a shell, and confined by its sandbox unless GATEWAY_STDIO_SANDBOX is off."""
    confined = sandbox if settings.GATEWAY_STDIO_SANDBOX == "bwrap" else None
    env = {"PATH": os.environ.get("PATH", "")} | env
    return ServerStart(slug, command, tuple(args), tuple(sorted(env.items())), cwd or None, confined)


def stderr_file() -> IO[bytes]:
    """A file of ours for a server's stderr, gone from the file system. Appending (O_APPEND), so that the server
    writes at the end even after the file was cut back to its tail."""
    fd, path = tempfile.mkstemp(prefix="upstream-stderr-")
    os.close(fd)
    errlog = open(path, "ab+")  # noqa: SIM115 (closed by its owner, with the connection)
    os.unlink(path)
    return errlog


def ending(returncode: int | None, confined: bool = False, cgroup: Cgroup | None = None) -> str:
    """How a server's process ended, in the operator's words. A sandbox's bwrap exits 128 + n for a server ended
    by signal n, as a shell does; a SIGKILL its cgroup counts as a kill at its memory limit is said as that."""
    if returncode is None:
        return "closed its output"
    if confined and 128 < returncode < 128 + signal.NSIG:
        returncode = 128 - returncode
    if returncode == -signal.SIGKILL and cgroup is not None and cgroup.memory_killed():
        return f"was killed: memory limit {cgroup.memory_mb} MiB"
    if returncode < 0:
        with suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass
class Launch:
    """How a server starts: its command line, environment and folder; confined, its cgroup and its `outbound`
    network (each None where it has none)."""

    command: list[str]
    env: dict[str, str]
    cwd: Any
    cgroup: Cgroup | None = None
    network: Outbound | None = None

    def release(self) -> None:
        """What it made, for a server that did not start."""
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.network is not None:
            self.network.close()


def launch(start: ServerStart) -> Launch:
    """How the server starts: confined, limited and on its network unless its sandbox is None."""
    inherited = {
        name: value for name in INHERITED if (value := os.environ.get(name)) is not None and not value.startswith("()")
    }
    env, sandbox = inherited | dict(start.env), start.sandbox
    if sandbox is None:
        return Launch([start.command, *start.args], env, start.cwd)
    executable = shutil.which(start.command, path=env.get("PATH"))
    if executable is None:
        raise FileNotFoundError(start.command)
    made = Launch([], env | {"HOME": HOME}, "/")
    try:
        made.network = Outbound(sandbox.internal) if sandbox.network == "outbound" else None
        options = made.network.bwrap_options() if made.network else []
        command = bwrap_command(os.path.abspath(executable), list(start.args), start.cwd, sandbox, options)
        command = [*rlimits(), *command]
        made.cgroup = cgroup_make(start.slug, sandbox)
    except BaseException:
        made.release()
        raise
    made.command = [*(made.cgroup.join() if made.cgroup else []), *command]
    return made
