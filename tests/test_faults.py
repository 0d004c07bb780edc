"""The fault campaign's slice (bench/faults.py; the whole of it: `bench/run faults`, docs/reliability.md): while
calls run through both executors, a worker killed mid-call, Redis restarted empty, PostgreSQL restarted, the stdio
upstreams killed and hung, the web processes killed, each briefly. Every bar must hold: each gateway serves
again in time, no call waits past its deadline, and every approval in the trail gets its completion."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs

ROOT = Path(__file__).resolve().parent.parent
FAULTS = ["worker_kill", "redis_restart", "postgres_restart", "upstream_kill", "upstream_hang", "web_kill"]

pytestmark = pytest.mark.e2e


def test_the_gateway_survives_each_fault_and_accounts_for_every_call(server_env, logs):
    needs("DATABASE_URL" in server_env, "the campaign restarts PostgreSQL's connections: PostgreSQL only")
    out = logs / "faults.json"
    command = [sys.executable, "bench/faults.py", "--seconds", "1", "--settle", "1", "--sessions", "2"]
    finished = subprocess.run(
        [*command, "--out", str(out)], env=server_env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-4000:]
    result = json.loads(out.read_text())
    assert [fault["fault"] for fault in result["faults"]] == FAULTS
    assert all(fault["held"] and fault["calls"] > 0 for fault in result["faults"]), result["faults"]
    assert result["audit"]["open"] == 0 and result["audit"]["approved"] > 0, result["audit"]
