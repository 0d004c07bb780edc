"""Teams came with nothing to do: an existing deployment migrates into a default team that owns everything,
its operators keep their powers as default-team roles, and its audit trail is never rewritten and still
verifies. Migrated on an empty database of its own, in a process of its own (tests/support/team_migration.py):
migrating the shared test database back and forth would pull it from under the other tests' gateways."""

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN
from tests.helpers import new_database

SCRIPT = Path(__file__).parent / "support" / "team_migration.py"


@pytest.fixture(scope="module")
def empty_database(server_env, tmp_path_factory) -> Iterator[dict[str, str]]:
    """The environment of a process whose database is empty."""
    with new_database(server_env, "teams", tmp_path_factory.mktemp("teams")) as env:
        yield env


@pytest.fixture(scope="module")
def migrated(empty_database) -> dict:
    done = subprocess.run(
        [str(BIN / "python"), str(SCRIPT)],
        env=empty_database | {"PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_existing_deployment_migrates_into_a_default_team_that_owns_everything(migrated):
    assert migrated["teams"] == [["default", "Default"]]
    assert migrated["owners"] == {
        "Upstream": ["default"],
        "HandoffRoute": ["default"],
        "Agent": ["default"],
        "AgentGroup": ["default"],
        "ServerGroup": ["default"],
        "Rule": ["default"],
    }


def test_operators_get_default_team_roles_by_what_they_may_do_and_superusers_need_none(migrated):
    assert migrated["member_teams"] == ["default"]
    assert migrated["members"] == {
        "op": "admin",  # a group that may change things
        "own-rights": "admin",  # a permission of their own that changes things
        "auditor": "auditor",  # the Auditor group
        "reader": "auditor",  # the Reader group: reads everything
        "staff-only": "member",  # staff with no powers in the console
    }  # "root" is a superuser (a gateway admin), "person" has no console role: neither gets a row


def test_audit_rows_written_before_teams_are_untouched_read_as_the_default_team_and_verify(migrated):
    assert migrated["audit"] == [["", 0, "default"], ["", 0, "default"]]
    assert (migrated["audit_intact"], migrated["audit_problems"], migrated["rows_checked"]) == (True, [], 2)
