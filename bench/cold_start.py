"""Cold start of the embedded default to the first answered call (issue 22's bar: <= 2 s after the first install).

Each run starts what scripts/demo starts after `scripts/bootstrap`, `manage.py serve_demo` (one process: the
database, the demo's setup, the finance specialist beside it, then Daphne), in a fresh temporary var dir (so a
fresh SQLite database and fresh keys); the official SDK client then initialises a 2025-11-25 session and calls
`demo__echo`. The clock starts when the process is spawned and stops when the call is answered. Phases seen
from outside:

- python+django: a separate process that only runs django.setup() (what the process pays first);
- demo upstream alone: a separate process that starts examples/demo_upstream.py on stdio and exits at end of input
  (what a first call pays when it has to spawn it);
- key printed: from the spawn to the demo key on stdout (Python and Django, the database, the demo's setup);
- daphne listening: from the key to the port accepting (Daphne and the ASGI app imported, the specialist spawned);
- initialize: the client's connect, initialize and notifications/initialized;
- first call: the first tools/call;
- second call: the same call again, warm, to show what the first one paid for starting things;
- restart: the same again on the same var dir (already migrated, the demo already registered), as a second
  `scripts/demo` would.

The schema template (handoff/management/commands/schema_ready.py) is made before the first run, as a first
install leaves it, and the gateway's bytecode compiled, as any start leaves it (scripts/image-slim's list, and the
examples): where PYTHONDONTWRITEBYTECODE is set (a sandbox, a CI runner) every start would compile them again, 0.2 s
and more. Before serve_demo (commit 7bc7bb8 and earlier), scripts/demo ran migrate, setup_demo and Daphne as three
processes: that commit's bench/cold_start.py measures those.

`--profile` then runs python -X importtime (imports by top-level package) and cProfile (the functions with the
most cumulative time) over what the process does, to name what dominates.

    bench/run cold_start [--runs 5] [--profile]
"""

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import IO

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from audit.static_compression import compressed_mark  # noqa: E402 (no Django needed)

PYTHON = str(ROOT / ".venv/bin/python")
START_BOUND = 60.0  # seconds a process may take to listen before the run fails
COMPILED = ("gateway_project", "registry", "handoff", "audit", "policy", "examples")
KEY = re.compile(rb"\b(sb_[A-Za-z0-9_-]+)")
DJANGO_SETUP = (
    "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'gateway_project.settings'); django.setup()"
)


def demo_env(var_dir: Path) -> dict[str, str]:
    """scripts/demo's: no DATABASE_URL or REDIS_URL (SQLite, in-memory layer), inline executor, INFO logs."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "LOG_LEVEL")
    }
    return env | {
        "GATEWAY_EXECUTOR": "inline",
        "GATEWAY_EXTRA_APPS": "examples.triage_app",
        "SWITCHBOARD_VAR_DIR": str(var_dir),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_listening(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_BOUND
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.005)  # a poll interval, bounded by the deadline above
    raise RuntimeError(f"nothing listened on {port} within {START_BOUND}s:\n{log.read_text()[-3000:]}")


def timed_run(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, cwd=ROOT, capture_output=True, check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started


async def first_calls(url: str, key: str) -> dict[str, float]:
    marks = {}
    started = time.perf_counter()
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            marks["initialize"] = time.perf_counter() - started
            for name in ("first_call", "second_call"):
                started = time.perf_counter()
                result = await client.call_tool("demo__echo", {"text": "cold"})
                assert not result.is_error, result
                marks[name] = time.perf_counter() - started
    return marks


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, 15)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(timeout=10)


def run_once(work: Path) -> dict[str, float]:
    """A start on a fresh var dir, then a restart on the same one (migrated, the demo registered)."""
    var_dir = Path(tempfile.mkdtemp(prefix="var-", dir=work))
    env = demo_env(var_dir)
    phases = {
        "python+django": timed_run([PYTHON, "-c", DJANGO_SETUP], env),
        "demo upstream alone": timed_run([PYTHON, "examples/demo_upstream.py"], env),
    }
    phases |= start_to_answer(var_dir, env, work)
    restart = start_to_answer(var_dir, env, work)
    return phases | {f"restart: {name}": seconds for name, seconds in restart.items()}


class Lines:
    """The process's output, each line with when it arrived, also written to `log`."""

    def __init__(self, process: subprocess.Popen, log: Path) -> None:
        self.seen: list[tuple[float, bytes]] = []
        self._arrived = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(process.stdout, log), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[bytes], log: Path) -> None:
        with log.open("wb") as out:
            for line in stream:
                out.write(line)
                with self._arrived:
                    self.seen.append((time.perf_counter(), line))
                    self._arrived.notify_all()

    def wait_for(self, pattern: re.Pattern[bytes], process: subprocess.Popen) -> tuple[float, re.Match[bytes]]:
        with self._arrived:
            found = self._arrived.wait_for(lambda: self._match(pattern) or process.poll() is not None, START_BOUND)
        if not found or not self._match(pattern):
            raise RuntimeError(
                f"no {pattern!r} within {START_BOUND}s:\n{b''.join(line for _, line in self.seen)[-3000:]}"
            )
        return self._match(pattern)

    def _match(self, pattern: re.Pattern[bytes]) -> tuple[float, re.Match[bytes]] | None:
        return next(((at, found) for at, line in self.seen if (found := pattern.search(line))), None)


def start_to_answer(var_dir: Path, env: dict[str, str], work: Path) -> dict[str, float]:
    """serve_demo from its spawn to the first answered call."""
    port = free_port()
    gateway_log = var_dir / "gateway.log"
    started = time.perf_counter()
    gateway = subprocess.Popen(
        [PYTHON, "manage.py", "serve_demo", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    phases = {}
    try:
        keyed_at, key = Lines(gateway, gateway_log).wait_for(KEY, gateway)
        phases["key printed"] = keyed_at - started
        wait_listening(port, gateway, gateway_log)
        phases["daphne listening"] = time.perf_counter() - keyed_at
        phases |= asyncio.run(first_calls(f"http://127.0.0.1:{port}/mcp", key.group(1).decode()))
        phases["total"] = time.perf_counter() - started - phases["second_call"]
        # Untimed: the static files' compression, which a first start leaves to a process of its own, done before
        # the restart is timed, as it would be by a restart minutes later.
        deadline = time.monotonic() + 120
        while not compressed_mark(var_dir / "static").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop(gateway)
        shutil.copy(gateway_log, work / "gateway.log")  # the last run's, kept beside the results
    return phases


def importtime(command: list[str], env: dict[str, str]) -> list[tuple[str, float]]:
    """Seconds of import per top-level package (self time summed), most first."""
    done = subprocess.run(
        [PYTHON, "-X", "importtime", *command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    per_package: dict[str, float] = defaultdict(float)
    for line in done.stderr.decode().splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and parts[0].split(":")[1].strip().isdigit():
            per_package[parts[2].strip().split(".")[0]] += int(parts[0].split(":")[1]) / 1e6
    return sorted(per_package.items(), key=lambda item: -item[1])


def cprofile(command: list[str], env: dict[str, str], out: Path) -> str:
    subprocess.run(
        [PYTHON, "-m", "cProfile", "-o", str(out), *command], env=env, cwd=ROOT, capture_output=True, check=True
    )
    show = f"import pstats; pstats.Stats({str(out)!r}).sort_stats('cumulative').print_stats(30)"
    return subprocess.run([PYTHON, "-c", show], capture_output=True, check=True, text=True).stdout


def profile(work: Path) -> None:
    var_dir = Path(tempfile.mkdtemp(prefix="profile-", dir=work))
    env = demo_env(var_dir)
    print("\n## Imports of `python -c 'django.setup()'` (self time by top-level package, top 15)\n")
    imports = importtime(["-c", DJANGO_SETUP], env)
    print(f"total {sum(seconds for _, seconds in imports):.2f} s")
    for package, seconds in imports[:15]:
        print(f"  {package:30} {seconds * 1000:7.0f} ms")
    print("\n## Imports of Daphne and the ASGI app it loads (gateway_project.asgi), top 15\n")
    imports = importtime(["-c", "import daphne.cli, gateway_project.asgi"], env)
    print(f"total {sum(seconds for _, seconds in imports):.2f} s")
    for package, seconds in imports[:15]:
        print(f"  {package:30} {seconds * 1000:7.0f} ms")
    print("\n## Imports of the stdio demo upstream (examples/demo_upstream.py), top 15\n")
    imports = importtime(["examples/demo_upstream.py"], env)
    print(f"total {sum(seconds for _, seconds in imports):.2f} s")
    for package, seconds in imports[:15]:
        print(f"  {package:30} {seconds * 1000:7.0f} ms")
    print("\n## cProfile of `manage.py schema_ready` on a fresh var dir (cumulative, top 30)\n")
    print(cprofile(["manage.py", "schema_ready"], env, work / "schema_ready.prof"))
    print("\n## cProfile of `manage.py setup_demo` on it (cumulative, top 30)\n")
    print(cprofile(["manage.py", "setup_demo"], env, work / "setup_demo.prof"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="also profile imports, schema_ready and setup_demo")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/cold_start.json")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="switchboard-cold-") as work:
        first_install = demo_env(Path(work) / "first-install")
        timed_run([PYTHON, "manage.py", "schema_ready"], first_install)  # the template, if this migration set has none
        timed_run([PYTHON, "-m", "compileall", "-q", *COMPILED], first_install)
        for number in range(args.runs):
            runs.append(run_once(Path(work)))
            print(f"run {number + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()), file=sys.stderr)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(runs, indent=2))
        shutil.copy(Path(work) / "gateway.log", args.out.parent / "cold_start_gateway.log")
        print(f"| phase (s) | median | min | max |  ({args.runs} runs)\n|---|---:|---:|---:|")
        for phase in runs[0]:
            values = [run[phase] for run in runs]
            print(f"| {phase} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
        if args.profile:
            profile(Path(work))


if __name__ == "__main__":
    main()
