"""Cold start of the embedded default to the first answered call (issue 22's bar: <= 2 s after the first install).

Each run does what scripts/demo does after `scripts/bootstrap`, in a fresh temporary var dir (so a fresh SQLite
database and fresh keys): `manage.py migrate`, `manage.py setup_demo` (the demo upstreams, their catalogs, the
demo agent), the finance specialist in the background, then Daphne; the official SDK client then initialises a
2025-11-25 session and calls `demo__echo`. The clock starts when migrate is spawned and stops when the call is
answered. Phases seen from outside:

- python+django: a separate process that only runs django.setup() (what each of the three processes pays first);
- demo upstream alone: a separate process that starts examples/demo_upstream.py on stdio and exits at end of input
  (what the first call pays to spawn it);
- migrate, setup_demo: each process's wall time (so each includes one python+django);
- daphne listening: from Daphne's spawn to its port accepting;
- initialize: the client's connect, initialize and notifications/initialized;
- first call: the first tools/call (the snapshot, the demo upstream's stdio spawn and handshake);
- second call: the same call again, warm, to show what the first one paid for starting things;
- restart: the same again on the same var dir (already migrated, the demo already registered), as a second
  `scripts/demo` would.

`--profile` then runs each process once more under `python -X importtime` (imports by top-level package) and
`cProfile` (the functions with the most cumulative time), to name what dominates.

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
import time
from collections import defaultdict
from pathlib import Path

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv/bin/python")
DAPHNE = str(ROOT / ".venv/bin/daphne")
START_BOUND = 60.0  # seconds a process may take to listen before the run fails
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


def timed_run(command: list[str], env: dict[str, str]) -> tuple[float, bytes]:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started, done.stdout


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
        "python+django": timed_run([PYTHON, "-c", DJANGO_SETUP], env)[0],
        "demo upstream alone": timed_run([PYTHON, "examples/demo_upstream.py"], env)[0],
    }
    phases |= start_to_answer(var_dir, env, work)
    restart = start_to_answer(var_dir, env, work)
    return phases | {f"restart: {name}": seconds for name, seconds in restart.items() if "call" not in name}


def start_to_answer(var_dir: Path, env: dict[str, str], work: Path) -> dict[str, float]:
    """scripts/demo from migrate to the first answered call."""
    port, specialist_port = free_port(), free_port()
    phases = {}
    clock = time.perf_counter()
    phases["migrate"] = timed_run([PYTHON, "manage.py", "migrate", "--verbosity", "0"], env)[0]
    specialist_url = f"http://127.0.0.1:{specialist_port}/mcp"
    phases["setup_demo"], out = timed_run([PYTHON, "manage.py", "setup_demo", "--specialist-url", specialist_url], env)
    key = KEY.search(out).group(1).decode()
    keys = {
        "SWITCHBOARD_DELEGATION_KEYS": (var_dir / "delegation_keys").read_text(),
        "SWITCHBOARD_URL": f"http://127.0.0.1:{port}",
    }
    spawn = {"cwd": ROOT, "stderr": subprocess.STDOUT, "start_new_session": True}
    specialist_log, gateway_log = var_dir / "specialist.log", var_dir / "gateway.log"
    specialist = subprocess.Popen(
        [PYTHON, "examples/specialist_server.py", "finance", str(specialist_port)],
        env=env | keys,
        stdout=specialist_log.open("wb"),
        **spawn,
    )
    started = time.perf_counter()
    gateway = subprocess.Popen(
        [DAPHNE, "-b", "127.0.0.1", "-p", str(port), "gateway_project.asgi:application"],
        env=env,
        stdout=gateway_log.open("wb"),
        **spawn,
    )
    try:
        wait_listening(port, gateway, gateway_log)
        phases["daphne listening"] = time.perf_counter() - started
        phases |= asyncio.run(first_calls(f"http://127.0.0.1:{port}/mcp", key))
        phases["total"] = time.perf_counter() - clock - phases["second_call"]
        phases["daphne start to first answer"] = phases["total"] - phases["migrate"] - phases["setup_demo"]
    finally:
        stop(gateway)
        stop(specialist)
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
    print("\n## Imports of the ASGI app Daphne loads (gateway_project.asgi), top 15\n")
    imports = importtime(["-c", "import gateway_project.asgi"], env)
    print(f"total {sum(seconds for _, seconds in imports):.2f} s")
    for package, seconds in imports[:15]:
        print(f"  {package:30} {seconds * 1000:7.0f} ms")
    print("\n## Imports of the stdio demo upstream (examples/demo_upstream.py), top 15\n")
    imports = importtime(["examples/demo_upstream.py"], env)
    print(f"total {sum(seconds for _, seconds in imports):.2f} s")
    for package, seconds in imports[:15]:
        print(f"  {package:30} {seconds * 1000:7.0f} ms")
    print("\n## cProfile of `manage.py migrate` on a fresh database (cumulative, top 30)\n")
    print(cprofile(["manage.py", "migrate", "--verbosity", "0"], env, work / "migrate.prof"))
    print("\n## cProfile of `manage.py setup_demo` (cumulative, top 30)\n")
    print(cprofile(["manage.py", "setup_demo"], env, work / "setup_demo.prof"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="also profile imports, migrate and setup_demo")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/cold_start.json")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="switchboard-cold-") as work:
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
