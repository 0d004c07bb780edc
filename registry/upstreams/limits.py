"""A confined stdio server's limits: its memory, processes and CPU share through a cgroup of its own, its open files
and file size as rlimits (util-linux's `prlimit`).

The cgroup is made before the server starts, under `switchboard/` of each controller (cgroup v1: memory, pids and
cpu; v2: one folder with the three enabled), and the server's launcher joins it before it runs anything, so nothing
it starts is outside it. It is read when the server ends (a kill at the memory limit is said as such) and removed
after. Where no cgroup can be made (not root, no delegated controllers), the rlimits still hold and a warning says
what is not limited. Not rlimits for the rest: an address-space limit is not a memory limit (Node dies at start
under one), RLIMIT_CPU is cumulative (it would kill a healthy pooled server) and RLIMIT_NPROC is per user."""

import logging
import os
import secrets
import shutil
import signal
import time
from contextlib import suppress
from functools import cache
from pathlib import Path

from django.conf import settings

from registry.upstreams.sandbox import SandboxRefused, SandboxSettings

logger = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
PARENT = "switchboard"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
EMPTY_WAIT = 2.0  # for a cgroup's last processes to end before its folder is removed
POLL = 0.01
# sh: join each cgroup named before `--`, then become the rest of the command line.
JOIN = 'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; shift; exec "$@"'
_warned: set[str] = set()


class Cgroup:
    """One server's cgroup: its folders (one per controller under v1, one under v2) and where its kills are
    counted. Its paths are plain str joined with os.path, never Paths: pathlib interns each part of a path, and a
    folder with a new name for each server would add an entry to CPython's table of interned strings each time
    (docs/reliability.md, "What RSS keeps beyond Python's heap")."""

    def __init__(self, folders: list[str], events: str, memory_mb: int) -> None:
        self.folders = folders
        self._events = events
        self.memory_mb = memory_mb

    def join(self) -> list[str]:
        """The start of a command line that moves itself into the cgroup, then runs the rest."""
        return ["/bin/sh", "-c", JOIN, "sh", *(os.path.join(folder, "cgroup.procs") for folder in self.folders), "--"]

    def _processes(self) -> list[int]:
        with suppress(OSError):
            with open(os.path.join(self.folders[0], "cgroup.procs")) as procs:
                return [int(pid) for pid in procs.read().split()]
        return []

    def memory_killed(self) -> bool:
        """Whether the kernel killed a process of it at its memory limit."""
        with suppress(OSError):
            with open(self._events) as events:
                lines = events.read().splitlines()
            for line in lines:
                name, _, count = line.partition(" ")
                if name == "oom_kill":
                    return int(count) > 0
        return False

    def remove(self) -> None:
        """Ends what is left in it and removes its folders. Called once the server has ended: the processes of its
        sandbox end a moment after it (bwrap's own, in a session of their own, die with their parent), and a
        folder still in use cannot be removed (it stays, and is said)."""
        deadline = time.monotonic() + EMPTY_WAIT
        while (left := self._processes()) and time.monotonic() < deadline:
            for pid in left:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(POLL)
        for folder in self.folders:
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("cgroup %s not removed: %s", folder, exc.strerror)


def _write(folder: str, name: str, value: str) -> None:
    with open(os.path.join(folder, name), "w") as file:
        file.write(value)


def _v1(name: str, sandbox: SandboxSettings) -> Cgroup:
    folders = [os.path.join(ROOT, controller, PARENT, name) for controller in CONTROLLERS]
    made = Cgroup(folders, os.path.join(folders[0], "memory.oom_control"), sandbox.memory_mb)
    try:
        for folder in folders:
            os.makedirs(folder)
        memory, pids, cpu = folders
        _write(memory, "memory.limit_in_bytes", str(sandbox.memory_mb << 20))
        if os.path.exists(os.path.join(memory, "memory.memsw.limit_in_bytes")):  # memory and swap: no swapping past it
            _write(memory, "memory.memsw.limit_in_bytes", str(sandbox.memory_mb << 20))
        _write(pids, "pids.max", str(sandbox.pids))
        _write(cpu, "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(cpu, "cpu.cfs_quota_us", str(round(sandbox.cpus * CPU_PERIOD_US)))
    except OSError:
        made.remove()
        raise
    return made


def _v2(name: str, sandbox: SandboxSettings) -> Cgroup:
    enable = " ".join(f"+{controller}" for controller in CONTROLLERS)
    parent = ROOT / PARENT
    (ROOT / "cgroup.subtree_control").write_text(enable)
    parent.mkdir(exist_ok=True)
    (parent / "cgroup.subtree_control").write_text(enable)
    folder = os.path.join(parent, name)
    os.mkdir(folder)
    made = Cgroup([folder], os.path.join(folder, "memory.events"), sandbox.memory_mb)
    try:
        _write(folder, "memory.max", str(sandbox.memory_mb << 20))
        if os.path.exists(os.path.join(folder, "memory.swap.max")):
            _write(folder, "memory.swap.max", "0")
        _write(folder, "pids.max", str(sandbox.pids))
        _write(folder, "cpu.max", f"{round(sandbox.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
    except OSError:
        made.remove()
        raise
    return made


@cache
def _sweep() -> None:
    """Once a process: removes the empty cgroups that processes now gone left (a gateway killed before it could),
    each named by the id of the process that made it."""
    for folder in [*ROOT.glob(f"*/{PARENT}/*-*-*"), *ROOT.glob(f"{PARENT}/*-*-*")]:
        owner = folder.name.rsplit("-", 2)[1]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with suppress(OSError):
                folder.rmdir()  # refused while a process is in it


def cgroup_make(slug: str, sandbox: SandboxSettings) -> Cgroup | None:
    """A cgroup of its own for one server of the upstream `slug`, or None where none can be made (warned once per
    reason): then its memory, processes and CPU are not limited."""
    _sweep()
    name = f"{slug}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        if (ROOT / "memory" / "memory.limit_in_bytes").exists():
            return _v1(name, sandbox)
        if (ROOT / "cgroup.controllers").exists():
            return _v2(name, sandbox)
        reason = f"no cgroup file system at {ROOT}"
    except OSError as exc:
        reason = f"{exc.filename}: {exc.strerror}"
    if reason not in _warned:
        _warned.add(reason)
        logger.warning(
            "stdio servers' memory, processes and CPU are not limited (no cgroup can be made: %s); "
            "their open files and file size are",
            reason,
        )
    return None


def rlimits() -> list[str]:
    """The start of a command line that holds the rest to the open files and file size a server may have."""
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        raise SandboxRefused("prlimit is not installed where upstreams run (Debian package `util-linux`)")
    files, size = settings.GATEWAY_STDIO_SANDBOX_NOFILE, settings.GATEWAY_STDIO_SANDBOX_FSIZE_MB << 20
    return [prlimit, f"--nofile={files}:{files}", f"--fsize={size}:{size}", "--"]
