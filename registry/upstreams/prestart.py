"""Stdio servers started before the gateway's own imports, for its upstream pool to adopt.

A Python server takes 0.7-1 s to import the SDK before it answers; the gateway, 1.5-2 s to set Django up and import
what serving needs, before its pool can start one. serve_demo's launcher (manage.py) starts the demo's servers first,
confined as the pool would confine them, so that both happen at once. The pool's stdio transport then takes the server
whose start (launch.py ServerStart: command, arguments, environment, folder, sandbox) is the very one it would make,
rather than start another, and owns it from then on as one it started. One that ended before it was taken is reported
and the pool starts its own; one not taken within UNCLAIMED_SECONDS (its upstream changed or disabled) is stopped.
Sandboxes with an `outbound` network are left to the pool: their network is set up from its event loop."""

import logging
import os
import signal
import subprocess
import threading
from contextlib import suppress
from dataclasses import dataclass
from typing import IO

from registry.upstreams.launch import Launch, ServerStart, ending, launch, stderr_file
from registry.upstreams.sandbox import SandboxRefused

logger = logging.getLogger(__name__)

UNCLAIMED_SECONDS = 120.0
EXIT_GRACE = 2.0  # for an unclaimed server to exit once its stdin closes, and again after SIGKILL


@dataclass
class Prestarted:
    start: ServerStart
    launched: Launch
    process: subprocess.Popen
    errlog: IO[bytes]

    def discard(self) -> None:
        """End the server (its stdin closed, then its process group killed) and free what its start made."""
        with suppress(OSError):
            self.process.stdin.close()  # type: ignore[union-attr]
        try:
            self.process.wait(EXIT_GRACE)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(EXIT_GRACE)
        with suppress(OSError):
            self.process.stdout.close()  # type: ignore[union-attr]
        self.errlog.close()
        self.launched.release()


_lock = threading.Lock()
_started: dict[ServerStart, Prestarted] = {}


def servers_prestart(starts: list[ServerStart]) -> list[Prestarted]:
    """Start each server now, kept for the pool, and say which started; one that cannot start is left to the pool,
    which says why."""
    started = []
    for start in starts:
        if start.sandbox is not None and start.sandbox.network == "outbound":
            continue
        try:
            launched = launch(start)
        except (OSError, SandboxRefused):
            logger.info("upstream %s: not started early; the pool starts it", start.slug, exc_info=True)
            continue
        errlog = stderr_file()
        try:
            process = subprocess.Popen(
                launched.command,
                env=launched.env,
                cwd=launched.cwd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errlog,
                start_new_session=True,  # its own process group, ended as a tree
            )
        except OSError:
            errlog.close()
            launched.release()
            logger.info("upstream %s: not started early; the pool starts it", start.slug, exc_info=True)
            continue
        started.append(Prestarted(start, launched, process, errlog))
        with _lock:
            _started[start] = started[-1]
    if started:
        timer = threading.Timer(UNCLAIMED_SECONDS, prestarted_discard, args=(started,))
        timer.daemon = True
        timer.start()
    return started


def prestarted_take(start: ServerStart) -> Prestarted | None:
    """The running server started early as `start` says, now the caller's; None if there is none. One that ended
    before it was taken is reported and ended."""
    with _lock:
        found = _started.pop(start, None)
    if found is None:
        return None
    if found.process.poll() is None:
        logger.info("upstream %s: taking its server started early (pid %d)", start.slug, found.process.pid)
        return found
    how = ending(found.process.returncode, start.sandbox is not None, found.launched.cgroup)
    logger.warning(
        "upstream %s: its server, started early, %s before the pool took it; starting another", start.slug, how
    )
    found.discard()
    return None


def prestarted_discard(started: list[Prestarted]) -> None:
    """Stop those of `started` that nothing took."""
    with _lock:
        unclaimed = [_started.pop(p.start) for p in started if _started.get(p.start) is p]
    for prestarted in unclaimed:
        logger.info("upstream %s: its server, started early, was not taken; stopping it", prestarted.start.slug)
        prestarted.discard()
