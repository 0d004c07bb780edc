"""The atheris targets (frames.py, session.py), each fuzzed in a process of its own, since libFuzzer owns the
process it runs in: a fixed number of runs in CI, FUZZ_SECONDS each through scripts/fuzz. A crash, an
unexpected exception, an input that runs over libFuzzer's per-input timeout or its memory limit fails the test,
with the input that did it saved beside the run's corpus."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.conftest import SECONDS

pytestmark = pytest.mark.e2e  # each starts a process of its own
ROOT = Path(__file__).resolve().parents[2]
SEEDS = Path(__file__).parent / "corpus"


def fuzz(target: str, runs: int, work: Path, env: dict[str, str], *flags: str) -> str:
    """Run the target; libFuzzer's summary of the run. New inputs go to a corpus in `work`, not to the seeds."""
    corpus = work / "corpus"
    shutil.copytree(SEEDS / target, corpus)
    bound = [f"-max_total_time={SECONDS}"] if SECONDS else [f"-runs={runs}", "-seed=1"]
    args = [*bound, *flags, "-timeout=30", "-rss_limit_mb=3072", "-print_final_stats=1", f"-artifact_prefix={work}/"]
    done = subprocess.run(
        [sys.executable, "-m", f"tests.fuzz.{target}", *args, str(corpus)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=(SECONDS or 120) + 120,
    )
    found = sorted(p.name for p in work.iterdir() if p.name.startswith(("crash-", "timeout-", "oom-")))
    assert done.returncode == 0 and not found, f"{found}\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    summary = " ".join(re.findall(r"^(?:Done .*|stat::number_of_executed_units.*|#\d+\s+DONE.*)$", done.stderr, re.M))
    print(f"{target}: {summary}")
    return summary


def test_the_frame_checks_answer_every_fuzzed_frame_with_a_json_rpc_error_or_a_message(tmp_path):
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "tests.settings"}
    assert "DONE" in fuzz("frames", 100_000, tmp_path, env)


def test_a_fuzzed_session_gets_one_encodable_reply_per_request_and_no_unexpected_exception(
    tmp_path, server_env, fuzz_agent
):
    env = server_env | {"DJANGO_SETTINGS_MODULE": "tests.settings", "FUZZ_AGENT": fuzz_agent.agent_name}
    assert "DONE" in fuzz("session", 1_500, tmp_path, env, "-max_len=600", "-len_control=0")
