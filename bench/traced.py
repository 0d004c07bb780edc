"""A gateway's web process under tracemalloc, for the benches that ask what its Python heap grows by
(bench/idle_sessions.py, bench/soak.py --trace): the server runs as usual, and each SIGUSR1 dumps a snapshot."""

import json
import os
import signal
import sys
import time
import tracemalloc
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024

# Daphne or uvicorn (argv[1]) with tracemalloc on; each SIGUSR1 dumps a snapshot to $TRACE_OUT.<n> (n = 1, 2, ...),
# each SIGUSR2 a census of the live objects the garbage collector tracks, by type, to $TRACE_OUT.census.<n>.
TRACED_SERVER = """
import collections, gc, json, os, signal, sys, tracemalloc
import gateway_project.asgi  # imported before tracing starts: tracing every import takes minutes
server = sys.argv.pop(1)
tracemalloc.start(int(os.environ.get("TRACE_FRAMES", "12")))
dumps = censuses = 0
def dump(signum, frame):
    global dumps
    dumps += 1
    tracemalloc.take_snapshot().dump(f"{os.environ['TRACE_OUT']}.{dumps}.part")
    os.rename(f"{os.environ['TRACE_OUT']}.{dumps}.part", f"{os.environ['TRACE_OUT']}.{dumps}")
def census(signum, frame):
    global censuses
    censuses += 1
    gc.collect()
    counts = collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
    path = f"{os.environ['TRACE_OUT']}.census.{censuses}"
    with open(f"{path}.part", "w") as out:
        json.dump(counts, out)
    os.rename(f"{path}.part", path)
signal.signal(signal.SIGUSR1, dump)
signal.signal(signal.SIGUSR2, census)
if server == "daphne":
    from daphne.cli import CommandLineInterface
    CommandLineInterface.entrypoint()
else:
    from uvicorn.main import main
    main()
"""


def traced_command(server: str, arguments: list[str]) -> list[str]:
    """The command that runs `server` (daphne or uvicorn) with `arguments` under tracemalloc."""
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
