"""A gateway's web process or Celery worker under tracemalloc, for the benches that ask what its Python heap grows by
(bench/idle_sessions.py, bench/soak.py --trace): the server runs as usual, and each SIGUSR1 dumps a snapshot."""

import json
import os
import signal
import sys
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path

from tests import servers

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024

# Daphne, uvicorn or a Celery worker (argv[1]) with tracemalloc on; each SIGUSR1 dumps a snapshot to
# $TRACE_OUT.<n> (n = 1, 2, ...), with malloc's own figures beside it in $TRACE_OUT.malloc.<n>; each SIGUSR2 a
# census of the live objects the garbage collector tracks, by type, to $TRACE_OUT.census.<n>.
TRACED_SERVER = """
import collections, ctypes, gc, json, os, signal, sys, tracemalloc
server = sys.argv.pop(1)
if server == "celery":
    import django
    django.setup()  # imported before tracing starts: tracing every import takes minutes
    import gateway_project.celery
else:
    import gateway_project.asgi
tracemalloc.start(int(os.environ.get("TRACE_FRAMES", "12")))
dumps = censuses = 0
class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
def malloc_figures():
    libc = ctypes.CDLL(None)
    figures = {}
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = Mallinfo2
        info = libc.mallinfo2()
        figures = {name: getattr(info, name) for name, _ in Mallinfo2._fields_}
    figures["traced"], figures["traced_peak"] = tracemalloc.get_traced_memory()
    figures["tracemalloc_own"] = tracemalloc.get_tracemalloc_memory()  # its traces, in malloc's figures too
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            name, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                figures[f"smaps_{name}_kib"] = int(value.split()[0])
    return figures
def dump(signum, frame):
    global dumps
    dumps += 1
    out = os.environ["TRACE_OUT"]
    with open(f"{out}.malloc.{dumps}", "w") as figures:
        json.dump(malloc_figures(), figures)
    tracemalloc.take_snapshot().dump(f"{out}.{dumps}.part")
    os.rename(f"{out}.{dumps}.part", f"{out}.{dumps}")
def census(signum, frame):
    global censuses
    censuses += 1
    gc.collect()
    counts = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
    path = f"{os.environ['TRACE_OUT']}.census.{censuses}"
    with open(f"{path}.part", "w") as out:
        json.dump(counts, out)
    os.rename(f"{path}.part", path)
def handlers_install(**kwargs):
    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, census)
if server == "daphne":
    handlers_install()
    from daphne.cli import CommandLineInterface
    CommandLineInterface.entrypoint()
elif server == "uvicorn":
    handlers_install()
    from uvicorn.main import main
    main()
else:  # the worker installs its own SIGUSR1 handler (a dump of its threads' stacks) as it starts: ours after it
    from celery.__main__ import main
    from celery.signals import worker_ready
    worker_ready.connect(handlers_install, weak=False)
    sys.argv = ["celery", *sys.argv[1:]]
    main()
"""


def traced_command(server: str, arguments: list[str]) -> list[str]:
    """The command that runs `server` (daphne, uvicorn, or celery: `arguments` as after `celery`) with `arguments`
    under tracemalloc."""
    return [sys.executable, "-c", TRACED_SERVER, server, *arguments]


def _asked(pid: int, signum: int, path: Path, bound: float) -> None:
    """Signal the traced process and wait, within `bound` seconds, for what it writes to `path`."""
    os.kill(pid, signum)
    deadline = time.monotonic() + bound
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing at {path} within {bound}s")
        time.sleep(0.1)  # a poll interval, bounded by the deadline


def traced_snapshot(pid: int, path: Path, bound: float = 60.0) -> tracemalloc.Snapshot:
    """Ask the traced process for a snapshot, which it writes to `path` ($TRACE_OUT.<n>)."""
    _asked(pid, signal.SIGUSR1, path, bound)
    return tracemalloc.Snapshot.load(str(path))


def traced_malloc(snapshot: Path) -> dict[str, int]:
    """malloc's figures (mallinfo2's fields, in bytes; smaps_rollup's, in KiB) taken with the snapshot at
    `snapshot` ($TRACE_OUT.<n>): what the process holds beyond what Python allocated."""
    stem, _, number = snapshot.name.rpartition(".")
    return json.loads(snapshot.with_name(f"{stem}.malloc.{number}").read_text())


def census_take(pid: int, path: Path, bound: float = 60.0) -> dict[str, int]:
    """Ask the traced process for a census of its live objects by type (module.qualname), written to `path`
    ($TRACE_OUT.census.<n>)."""
    _asked(pid, signal.SIGUSR2, path, bound)
    return json.loads(path.read_text())


def owner(trace: tracemalloc.StatisticDiff) -> tuple[str, str]:
    """The innermost frame outside the standard library: its package (or repository module), and its line."""
    for frame in reversed(trace.traceback):  # tracemalloc lists the oldest call first
        name = frame.filename
        if "site-packages/" in name:
            where = name.split("site-packages/", 1)[1]
            return where.split("/", 1)[0], f"{where}:{frame.lineno}"
        if name.startswith(str(ROOT)) and "/.venv/" not in name:
            where = str(Path(name).relative_to(ROOT))
            return where, f"{where}:{frame.lineno}"
    name = f"stdlib {Path(trace.traceback[-1].filename).name}"
    return name, f"{name}:{trace.traceback[-1].lineno}"


def growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot) -> tuple[dict[str, int], dict[str, int]]:
    """What the heap grew by from `before` to `after`, in bytes: by package (or module), and by line."""
    per_owner: dict[str, int] = defaultdict(int)
    per_line: dict[str, int] = defaultdict(int)
    for diff in after.compare_to(before, "traceback"):
        package, line = owner(diff)
        per_owner[package] += diff.size_diff
        per_line[line] += diff.size_diff
    return per_owner, per_line


def growth_table(sizes: dict[str, int], title: str, per: int, unit: str, top: int = 12) -> str:
    """The largest growths as a Markdown table, also per `unit` (a session, a minute) of which there were `per`."""
    lines = [f"| allocated by ({title}) | MiB | KiB / {unit} |", "|---|---:|---:|"]
    for name, size in sorted(sizes.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"| {name} | {size / MIB:.2f} | {size / max(per, 1) / 1024:.1f} |")
    return "\n".join(lines)


def traced_gateway(env: dict[str, str], work: Path, name: str) -> tuple[servers.Running, Path]:
    """A Daphne gateway under tracemalloc, its log `work`/<name>_traced.log; and where its snapshots go
    (`work`/trace.<n>, an earlier run's removed: they would be taken for this one's)."""
    port, out = servers.free_port(), work / "trace"
    for stale in work.glob("trace.*"):
        stale.unlink()
    command = traced_command("daphne", ["-b", "127.0.0.1", "-p", str(port), "gateway_project.asgi:application"])
    log = work / f"{name}_traced.log"
    process = servers.start(command, env | {"TRACE_OUT": str(out)}, log)
    gateway = servers.Running(process, log, f"http://127.0.0.1:{port}")
    try:
        servers.wait_for_port(port, process, log)
    except RuntimeError:
        gateway.stop()
        raise
    return gateway, out


def growth_report(
    before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, count: int, unit: str, top: int = 12
) -> str:
    """What the heap grew by for `count` of `unit` (a session, a held call), by package and by line."""
    per_owner, per_line = growth(before, after)
    total = sum(per_owner.values())
    lines = [
        f"\nPython heap growth under tracemalloc for {count} {unit}s: {total / MIB:.1f} MiB "
        f"({total / max(count, 1) / 1024:.1f} KiB per {unit}), by the code that allocated it:\n"
    ]
    for title, sizes in (("package", per_owner), ("line", per_line)):
        lines.append(growth_table(sizes, title, count, unit, top) + "\n")
    return "\n".join(lines)
