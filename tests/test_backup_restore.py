"""A backup as docs/deploy.md describes it (the keys' directory, and `pg_dump` of the database, which holds the
secret store's database backend) restores with `pg_restore` into an empty database: its audit trail verifies and a
person's sealed credential opens with the restored keys, and with no other. Real commands, in processes of their
own, on databases of their own."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from gateway_project.lib.keys import KEY_FILES
from tests import servers
from tests.helpers import new_database

pytestmark = pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_dump and pg_restore need PostgreSQL")

PERSON = {"issuer": "https://idp.example.com", "subject": "backup-alice", "name": "Alice"}
STATE = f"""
from audit.services import audit_record
from registry.models import Upstream
from registry.personal import personal_connect
from registry.services import upstream_save
upstream = Upstream(slug="backup-docs", transport="streamable_http", url="http://127.0.0.1:9/mcp", internal=True,
                    per_person=True)
upstream.full_clean()
upstream_save(upstream=upstream, actor="backup-test", created=True)
personal_connect(upstream=upstream, kind="token", values={{"token": "alice-s3cret"}}, **{PERSON!r})
audit_record(kind="admin_change", actor="backup-test", detail={{"action": "backup_marker"}})
"""
OPEN = f"""
import json
from registry.credentials import CredentialError
from registry.models import PersonalCredential
from registry.personal import stored_path
from registry.secret_store import secret_store, secrets_open
credential = PersonalCredential.objects.get(person_subject={PERSON["subject"]!r})
path = stored_path(credential, credential.upstream.slug)
try:
    print(json.dumps(secrets_open(path, secret_store().read(path))))
except CredentialError as exc:
    print(json.dumps({{"refused": str(exc)}}))
"""


def run(env: dict[str, str], *command: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(command, env=env, cwd=servers.ROOT, capture_output=True, text=True, timeout=180)
    assert (done.returncode == 0) == ok, done.stderr[-3000:]
    return done


def opened(env: dict[str, str]) -> dict[str, str]:
    """What the person's credential opens to in that environment (the shell's last line), or why it does not."""
    return json.loads(manage(env, "shell", "-c", OPEN).stdout.splitlines()[-1])


def manage(env: dict[str, str], *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    return run(env, sys.executable, str(servers.ROOT / "manage.py"), *args, ok=ok)


def keys(server_env: dict[str, str], directory: Path) -> dict[str, str]:
    """A new set of keys made by `keys_make` into `directory`: the *_FILE variables that give them."""
    made = manage({k: v for k, v in server_env.items() if k != "DATABASE_URL"}, "keys_make", str(directory))
    lines = (line.partition("=") for line in made.stdout.splitlines())
    return {name: value for name, _, value in lines if name.removesuffix("_FILE") in KEY_FILES}


def given(env: dict[str, str], key_files: dict[str, str]) -> dict[str, str]:
    """The environment with its keys given by these files alone (none made, none inherited)."""
    kept = {k: v for k, v in env.items() if k.removesuffix("_FILE") not in {*KEY_FILES, "GATEWAY_MAKE_KEYS"}}
    return kept | key_files


def test_a_backup_restores_into_an_empty_database_with_its_trail_and_a_persons_credential(server_env, tmp_path):
    key_files = keys(server_env, tmp_path / "keys")
    other_keys = keys(server_env, tmp_path / "other-keys")
    dump = tmp_path / "switchboard.dump"

    with new_database(server_env, "backup_source", tmp_path) as source:
        source = given(source, key_files)
        manage(source, "migrate", "-v0")
        manage(source, "shell", "-c", STATE)
        run(source, "pg_dump", "--format=custom", f"--file={dump}", source["DATABASE_URL"])
    with new_database(server_env, "backup_restored", tmp_path) as restored:
        run(restored, "pg_restore", "--no-owner", f"--dbname={restored['DATABASE_URL']}", str(dump))
        verified = manage(given(restored, key_files), "audit_verify").stdout
        credential = opened(given(restored, key_files))
        wrong_keys = opened(given(restored, other_keys))
        wrong_trail = manage(given(restored, other_keys), "audit_verify", ok=False).stderr

    assert verified.startswith("Audit trail intact: ")
    assert credential == {"token": "alice-s3cret"}
    assert wrong_keys["refused"].startswith("the value of tenants/")
    assert "which this process does not hold" in wrong_keys["refused"]
    assert "Audit trail NOT intact" in wrong_trail
