"""The soak (bench/soak.py): its judging on synthetic series, and a half-minute slice of the real thing (the
full run is `bench/run soak`, docs/reliability.md; its bars are not judged on half a minute)."""

import argparse
import json
import os
import shutil
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from bench import soak, soak_judge
from tests.conftest import needs
from tests.servers import ROOT

MIB_KIB = 1024


def samples(minutes: int = 30, redis_growth: float = 0.0) -> list[dict]:
    """A sample a minute: `steady` grows 0.05 MiB/min, `leaky` 0.3 MiB/min, `opener` gains descriptors, a Deno
    sandbox lives for one sample, Redis holds near 2 MiB (or grows by `redis_growth` over the run)."""
    made = []
    for minute in range(minutes + 1):
        wobble = (-1) ** minute
        processes = {
            "1": {"label": "gateway", "rss_kib": int((100 + 0.05 * minute) * MIB_KIB), "fds": 30 + wobble},
            "2": {"label": "worker", "rss_kib": int((50 + 0.3 * minute) * MIB_KIB), "fds": 40},
            "3": {"label": "specialist", "rss_kib": 70 * MIB_KIB, "fds": 40 + minute // 3},
        }
        if minute == 15:
            processes["4"] = {"label": "worker/deno", "rss_kib": 90 * MIB_KIB, "fds": 12}
        memory = 2 * 1024 * 1024 * (1 + redis_growth * minute / minutes) + 1000 * wobble
        made.append({"t": minute * 60.0, "operations": 0, "processes": processes, "redis_used_memory": memory})
    return made


def test_the_judge_fits_rss_growth_and_compares_levels_over_the_last_two_thirds():
    verdict = soak_judge.judge(samples(), start=600.0)

    rows = {row["label"]: row for row in verdict["rows"]}
    gateway, worker, specialist = rows["gateway"], rows["worker"], rows["specialist"]
    # 100 MiB + 0.05 MiB/min: 100.5 MiB at minute 10, 101.5 MiB at minute 30.
    assert gateway["rss_start_mib"] == pytest.approx(100.5, abs=0.01)
    assert gateway["rss_end_mib"] == pytest.approx(101.5, abs=0.01)
    assert gateway["mib_per_minute"] == pytest.approx(0.05, abs=0.001)
    assert gateway["growth_percent"] == pytest.approx(1 / 100.5 * 100, abs=0.01)
    assert gateway["rss_ok"] and gateway["fds_ok"] and (gateway["fds_min"], gateway["fds_max"]) == (29, 31)
    # Over 5 % (53 -> 59 MiB is 11 %) and over 0.1 MiB/min (0.3): both bars fail.
    assert worker["mib_per_minute"] == pytest.approx(0.3, abs=0.001) and not worker["rss_ok"]
    # Descriptors: the median of the first minute's samples (43, at minute 10) against the last's (50).
    assert (specialist["fds_start"], specialist["fds_end"]) == (43, 50)
    assert specialist["rss_ok"] and not specialist["fds_ok"]
    assert verdict["transient"] == {"worker/deno": 1}
    assert verdict["redis"]["ok"] and not verdict["ok"]


def test_redis_memory_that_grows_by_more_than_a_tenth_fails_its_bar():
    assert not soak_judge.judge(samples(redis_growth=0.3), start=600.0)["redis"]["ok"]
    assert soak_judge.judge(samples(redis_growth=0.1), start=600.0)["redis"]["ok"]  # 2.07 -> 2.2 MiB: 6.5 %


def test_a_mode_without_redis_is_judged_on_its_processes_alone():
    without = [sample | {"redis_used_memory": None} for sample in samples()]

    verdict = soak_judge.judge(without, start=600.0)

    assert verdict["redis"] is None and not verdict["ok"]  # the worker's 0.3 MiB/min still fails
    assert "No Redis in this mode." in soak_judge.table(verdict)


def test_redis_keys_are_counted_by_kind_with_their_ids_starred():
    names = [
        b"sb:mcp-ended:0123456789abcdef0123456789abcdef",
        b"sb:mcp-ended:fedcba9876543210fedcba9876543210",
        b"sb:calls:12:key-sb_41aa",
        b"sb:calls:7:ws-0123456789abcdef",
        b"_kombu.binding.upstream",
    ]

    assert [soak.key_kind(name) for name in names] == [
        "sb:mcp-ended:*",
        "sb:mcp-ended:*",
        "sb:calls:*:key-sb_*aa",
        "sb:calls:*:*",
        "_kombu.binding.upstream",
    ]


def test_clients_are_given_as_kinds_and_counts():
    assert soak.clients_parse("legacy:2,stateless,ws:1") == ["legacy", "legacy", "stateless", "ws"]
    with pytest.raises(argparse.ArgumentTypeError, match="'sse' is not a kind of client"):
        soak.clients_parse("sse:1")


@pytest.mark.e2e
@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_a_half_minute_soak_makes_every_kind_of_operation_with_every_kind_of_client_without_a_failure(server, tmp_path):
    database = os.environ.get("DATABASE_URL", "")
    needs(database.startswith("postgres"), "DATABASE_URL is not PostgreSQL: the soak runs on PostgreSQL only")
    needs(shutil.which("redis-server") is not None, "redis-server is not installed: the soak starts its own")
    # A database of the slice's own beside the test database: the full soak's (switchboard_soak) may be running.
    own = urlsplit(database)._replace(path=f"{urlsplit(database).path}_soak_slice").geturl()
    out = tmp_path / "soak.json"
    # The inline executor, sessions renewed every 5 operations, every kind of client: what the earlier soak left out.
    command = [sys.executable, str(ROOT / "bench/soak.py"), "--minutes", "0.5", "--every", "2", "--session-ops", "5"]
    command += ["--modes", "inline", "--servers", server, "--database-url", own]
    command += ["--out", str(out), "--png", str(tmp_path / "soak.png")]
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    finished = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=150)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["failed"] == {} and document["errors"] == []
    assert {"echo", "sleep", "time", "list", "handoff", "execute"} <= set(document["done"])
    assert {"legacy sessions", "stateless sessions", "ws sessions"} <= set(document["done"])
    assert (document["run"]["mode"], document["run"]["server"]) == ("inline", server)
    assert len(document["samples"]) >= 10
    labels = {p["label"] for sample in document["samples"] for p in sample["processes"].values()}
    assert {"gateway", "gateway/demo_upstream.py", "gateway/mcp-server-time", "specialist", "redis"} <= labels
    assert document["redis_keys"]["before"] > 0 and "redis_used_memory" in document["samples"][-1]
    assert (tmp_path / "soak.png").stat().st_size > 10_000
