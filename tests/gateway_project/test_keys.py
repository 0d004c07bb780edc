"""Keys are given, never made, outside the embedded default (gateway_project/settings/keys.py): a process with
DATABASE_URL and a key missing, or a key's file unreadable or empty, stops naming it and makes none in var/;
`manage.py keys_make` makes a complete set once, which such a process then starts with."""

from pathlib import Path

import pytest

from tests.test_settings import python, start

DATABASE = {"DATABASE_URL": "postgres://postgres@127.0.0.1:5432/switchboard_keys"}
FILES = {
    "SECRET_KEY": "secret_key",
    "GATEWAY_CREDENTIAL_KEYS": "credential_key",
    "GATEWAY_DELEGATION_KEYS": "delegation_keys",
    "GATEWAY_AUDIT_KEYS": "audit_keys",
    "GATEWAY_TASK_KEY": "task_key",
    "GATEWAY_AUTH_SIGNING_KEY": "auth_signing_key.pem",
}
MAKE_NO_KEYS = (
    "This process makes no keys (GATEWAY_MAKE_KEYS is off): make a set once with `manage.py keys_make` and give "
    "every process the same."
)
PRINT_KEYS = "import django; django.setup(); from django.conf import settings as s; " + (
    "print(s.SECRET_KEY, ','.join(s.GATEWAY_CREDENTIAL_KEYS), s.GATEWAY_DELEGATION_KEYS, s.GATEWAY_AUDIT_KEYS, "
    "s.GATEWAY_TASK_KEY, s.GATEWAY_CREDENTIAL_PUBLIC_KEY)"
)


def error(started) -> str:
    assert started.returncode == 1, started.stdout
    return started.stderr.strip().splitlines()[-1].removeprefix("django.core.exceptions.ImproperlyConfigured: ")


def made_in_var(var: Path) -> list[str]:
    return sorted(path.name for path in var.iterdir() if path.name in FILES.values())


@pytest.fixture(scope="module")
def key_set(tmp_path_factory) -> Path:
    """A set made by the command, on the embedded default (no DATABASE_URL) in a var dir of its own."""
    var = tmp_path_factory.mktemp("var")
    made = python(var, ["manage.py", "keys_make", str(var / "keys")], {})
    assert made.returncode == 0, made.stderr
    return var / "keys"


def given(keys: Path, *, leave_out: str = "") -> dict[str, str]:
    return {f"{name}_FILE": str(keys / file) for name, file in FILES.items() if name != leave_out}


def test_without_any_key_a_process_on_a_database_stops_naming_the_first_and_makes_none(tmp_path):
    started = start(tmp_path, **DATABASE)
    assert error(started) == f"SECRET_KEY is not set: give it (or SECRET_KEY_FILE, a file holding it). {MAKE_NO_KEYS}"
    assert made_in_var(tmp_path) == []


@pytest.mark.parametrize("missing", FILES)
def test_each_key_left_out_stops_the_process_naming_it(tmp_path, key_set, missing):
    started = start(tmp_path, **DATABASE, **given(key_set, leave_out=missing))
    either = " or GATEWAY_CREDENTIAL_PUBLIC_KEY (a web process that only seals)" * (
        missing == "GATEWAY_CREDENTIAL_KEYS"
    )
    assert (
        error(started)
        == f"{missing} is not set: give it{either} (or {missing}_FILE, a file holding it). {MAKE_NO_KEYS}"
    )
    assert made_in_var(tmp_path) == []


def test_a_web_process_given_the_public_key_alone_holds_no_private_one(tmp_path, key_set):
    env = given(key_set, leave_out="GATEWAY_CREDENTIAL_KEYS")
    env["GATEWAY_CREDENTIAL_PUBLIC_KEY_FILE"] = str(key_set / "credential_public_key")
    started = python(tmp_path, ["-c", PRINT_KEYS], DATABASE | env)
    assert started.returncode == 0, started.stderr
    # No private key printed (an empty field), then the public one.
    assert started.stdout.split() == [*started.stdout.split()[:4], (key_set / "credential_public_key").read_text()]
    assert made_in_var(tmp_path) == []


@pytest.mark.parametrize("make_keys", ["0", "1"])
def test_a_missing_or_unreadable_key_file_stops_the_process_naming_it_even_where_keys_are_made(
    tmp_path, key_set, make_keys
):
    for path, reason in [(tmp_path / "absent", "No such file or directory"), (tmp_path, "Is a directory")]:
        env = given(key_set) | {"GATEWAY_AUDIT_KEYS_FILE": str(path), "GATEWAY_MAKE_KEYS": make_keys}
        started = start(tmp_path, **DATABASE, **env)
        assert error(started) == f"GATEWAY_AUDIT_KEYS_FILE must be a readable file ({reason}), not '{path}'"
        assert made_in_var(tmp_path) == []


@pytest.mark.parametrize("make_keys", ["0", "1"])
def test_an_empty_key_file_stops_the_process_naming_it_and_no_key_is_made_instead(tmp_path, key_set, make_keys):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    env = given(key_set) | {"SECRET_KEY_FILE": str(empty), "GATEWAY_MAKE_KEYS": make_keys}
    assert error(start(tmp_path, **DATABASE, **env)) == f"SECRET_KEY_FILE names an empty file, not a key: '{empty}'"
    assert made_in_var(tmp_path) == []


def test_a_process_given_the_set_keys_make_made_holds_those_keys(tmp_path, key_set):
    assert sorted(path.name for path in key_set.iterdir()) == sorted([*FILES.values(), "credential_public_key"])
    assert {oct(path.stat().st_mode & 0o777) for path in key_set.iterdir()} == {"0o600"}
    started = python(tmp_path, ["-c", PRINT_KEYS], DATABASE | given(key_set))
    assert started.returncode == 0, started.stderr
    files = {name: (key_set / file).read_text() for name, file in FILES.items()}
    assert started.stdout.split()[:5] == [files[name] for name in list(FILES)[:5]]
    assert files["GATEWAY_AUTH_SIGNING_KEY"].startswith("-----BEGIN PRIVATE KEY-----")
    assert made_in_var(tmp_path) == []


def test_keys_make_never_writes_over_a_set_and_prints_no_key(tmp_path, key_set):
    before = {path.name: path.read_text() for path in key_set.iterdir()}
    again = python(tmp_path, ["manage.py", "keys_make", str(key_set)], {})
    assert again.returncode == 1
    names = ", ".join(sorted(before))
    assert again.stderr.strip() == f"CommandError: {key_set} already holds {names}: no key was made"
    assert {path.name: path.read_text() for path in key_set.iterdir()} == before
    fresh = python(tmp_path, ["manage.py", "keys_make", str(tmp_path / "fresh")], {})
    assert fresh.stdout.splitlines()[0] == f"SECRET_KEY_FILE={tmp_path / 'fresh' / 'secret_key'}"
    made = [(tmp_path / "fresh" / name).read_text() for name in before]
    assert not any(key in fresh.stdout + fresh.stderr for key in made)
    assert set(made).isdisjoint(before.values())


@pytest.mark.parametrize("environment", [{}, DATABASE | {"GATEWAY_MAKE_KEYS": "1"}], ids=["embedded", "opted-in"])
def test_the_embedded_default_or_a_process_that_opts_in_makes_each_key_once_in_var(tmp_path, environment):
    first = python(tmp_path, ["-c", PRINT_KEYS], environment)
    second = python(tmp_path, ["-c", PRINT_KEYS], environment)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert made_in_var(tmp_path) == sorted(set(FILES.values()) - {"task_key"})
    assert {oct((tmp_path / name).stat().st_mode & 0o777) for name in made_in_var(tmp_path)} == {"0o600"}


def test_keys_kept_in_var_are_read_on_a_database_and_one_taken_away_is_named_not_made(tmp_path):
    """A checkout that ran the embedded default keeps its keys when it moves to PostgreSQL; none is made there."""
    embedded = python(tmp_path, ["-c", PRINT_KEYS], {})
    on_a_database = python(tmp_path, ["-c", PRINT_KEYS], DATABASE | {"GATEWAY_MAKE_KEYS": "0"})
    assert (on_a_database.returncode, on_a_database.stdout) == (0, embedded.stdout), on_a_database.stderr
    (tmp_path / "audit_keys").unlink()
    started = start(tmp_path, **DATABASE)
    message = "GATEWAY_AUDIT_KEYS is not set: give it (or GATEWAY_AUDIT_KEYS_FILE, a file holding it)."
    assert error(started) == f"{message} {MAKE_NO_KEYS}"
    assert not (tmp_path / "audit_keys").exists()
