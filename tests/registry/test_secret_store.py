"""The personal-credential secret store's contract, run against both backends: the database (registry.SealedSecret)
and Vault's KV v2 on a real OpenBao dev server (tests/support/openbao.py). Then what only Vault has: the entry at
the KV path the layout names, every version gone on delete, and its errors, which name the path and the cause but
never a value or the token."""

import json
import uuid
from collections.abc import Iterator

import pytest
from hvac import Client
from hvac.exceptions import InvalidPath

from registry.credentials import CredentialError
from registry.secret_store import DatabaseStore, SecretStore, secret_path, secret_store, secrets_open, secrets_seal
from registry.vault_store import VaultStore, VaultStoreError
from tests.servers import SilentServer, free_port
from tests.support.openbao import OpenBao, openbao_dev

CANARY = "canary-5e1d-do-not-log"


@pytest.fixture(scope="module")
def openbao(tmp_path_factory) -> Iterator[OpenBao]:
    with openbao_dev(tmp_path_factory.mktemp("openbao")) as server:
        yield server


# `db` for both: pytest-django makes the test database only for tests that name it.
@pytest.fixture(params=["database", pytest.param("vault", marks=pytest.mark.e2e)])
def store(request, db) -> SecretStore:
    if request.param == "database":
        return DatabaseStore()
    server = request.getfixturevalue("openbao")
    return VaultStore(url=server.url, token=server.token, mount="secret")


@pytest.fixture
def vault(openbao) -> VaultStore:
    return VaultStore(url=openbao.url, token=openbao.token, mount="secret")


def path_of(person: str, service: str) -> str:
    return secret_path(team="payments", person=person, service=service)


def a_person() -> str:
    """A person as the store sees them: a digest, fresh for each test (the database's rows are committed)."""
    return uuid.uuid4().hex


# --- The contract, for both backends ------------------------------------------------------------------------


def test_a_written_secret_reads_back_and_a_new_write_replaces_it_whole(store):
    path = path_of(a_person(), "github")
    store.write(path, {"access_token": "first", "refresh_token": "second"})
    assert store.read(path) == {"access_token": "first", "refresh_token": "second"}
    store.write(path, {"access_token": "third"})
    assert store.read(path) == {"access_token": "third"}, "replaced, not merged"
    store.delete(path)


def test_a_deleted_secret_reads_empty_and_deleting_it_again_is_fine(store):
    path = path_of(a_person(), "github")
    store.write(path, {"access_token": "first"})
    store.delete(path)
    assert store.read(path) == {}
    store.delete(path)
    assert store.read(path) == {}


def test_a_path_never_written_reads_empty_and_deletes_quietly(store):
    path = path_of(a_person(), "github")
    assert store.read(path) == {}
    store.delete(path)


def test_two_peoples_paths_and_one_persons_services_stay_apart(store):
    ada, bob = a_person(), a_person()
    paths = {
        (ada, "github"): {"access_token": "ada-github"},
        (ada, "jira"): {"access_token": "ada-jira"},
        (bob, "github"): {"access_token": "bob-github"},
    }
    for (person, service), values in paths.items():
        store.write(path_of(person, service), values)
    store.delete(path_of(ada, "github"))
    assert store.read(path_of(ada, "github")) == {}
    assert store.read(path_of(ada, "jira")) == {"access_token": "ada-jira"}
    assert store.read(path_of(bob, "github")) == {"access_token": "bob-github"}
    for person, service in paths:
        store.delete(path_of(person, service))


def test_values_round_trip_exactly(store):
    path = path_of(a_person(), "github")
    values = {
        "unicode": "pässwörd 秘密 🔑 مفتاح \u200b",
        "quoting": 'a "quoted" \\backslash\\ and\nnewlines\r\n\ttabs {"json": [1]} %s %(x)s',
        "long": "x" * 65_536 + "end",
        "empty": "",
        "spaces": "  leading and trailing  ",
    }
    store.write(path, values)
    assert store.read(path) == values
    store.delete(path)


def test_a_value_sealed_for_one_path_opens_there_and_not_at_another(store):
    ada, bob = (
        path_of(a_person(), "github"),
        path_of(a_person(), "github"),
    )
    store.write(ada, secrets_seal(ada, {"access_token": CANARY}))
    stored = store.read(ada)
    assert CANARY not in json.dumps(stored), "the store holds only sealed values"
    assert secrets_open(ada, stored) == {"access_token": CANARY}
    store.write(bob, stored)  # someone who can write the store copies Ada's entry to Bob's path
    with pytest.raises(CredentialError, match="does not open: altered, or moved from another name"):
        secrets_open(bob, store.read(bob))
    store.delete(ada)
    store.delete(bob)


# --- Vault only -------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_the_vault_entry_sits_at_the_kv_path_the_layout_names(vault, openbao):
    person = a_person()
    path = path_of(person, "github")
    assert path == f"tenants/default/teams/payments/users/{person}/github"
    vault.write(path, {"access_token": "sealed-value"})
    shown = openbao.bao("kv", "get", "-format=json", "-mount=secret", path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["data"]["data"] == {"access_token": "sealed-value"}
    direct = Client(url=openbao.url, token=openbao.token).secrets.kv.v2
    read = direct.read_secret_version(path=path, mount_point="secret", raise_on_deleted_version=True)
    assert read["data"]["data"] == {"access_token": "sealed-value"}
    vault.delete(path)


@pytest.mark.e2e
def test_delete_removes_the_secret_with_every_version(vault, openbao):
    path = path_of(a_person(), "github")
    vault.write(path, {"access_token": "v1"})
    vault.write(path, {"access_token": "v2"})
    direct = Client(url=openbao.url, token=openbao.token).secrets.kv.v2
    assert direct.read_secret_metadata(path=path, mount_point="secret")["data"]["current_version"] == 2
    vault.delete(path)
    with pytest.raises(InvalidPath):
        direct.read_secret_metadata(path=path, mount_point="secret")
    with pytest.raises(InvalidPath):
        direct.read_secret_version(path=path, mount_point="secret", version=1, raise_on_deleted_version=True)


@pytest.mark.e2e
def test_a_latest_version_deleted_by_hand_reads_empty(vault, openbao):
    path = path_of(a_person(), "github")
    vault.write(path, {"access_token": "v1"})
    assert openbao.bao("kv", "delete", "-mount=secret", path).returncode == 0  # a soft delete: metadata stays
    assert vault.read(path) == {}
    vault.delete(path)


@pytest.mark.e2e
def test_a_wrong_token_is_refused_with_an_error_that_names_the_path_and_not_the_token(openbao):
    wrong = f"{CANARY}-token"
    store = VaultStore(url=openbao.url, token=wrong, mount="secret")
    path = path_of(a_person(), "github")
    denied = "permission denied (GATEWAY_VAULT_TOKEN is not valid, or its policy does not allow this)"
    for verb, attempt in [
        ("write", lambda: store.write(path, {"access_token": CANARY})),
        ("read", lambda: store.read(path)),
        ("delete", lambda: store.delete(path)),
    ]:
        with pytest.raises(VaultStoreError) as error:
            attempt()
        assert str(error.value) == f"Vault could not {verb} secret/{path}: {denied}"
        assert CANARY not in str(error.value)
        assert error.value.__cause__ is None and error.value.__suppress_context__


@pytest.mark.e2e
def test_a_mount_that_does_not_exist_is_an_error_not_an_empty_read(openbao):
    store = VaultStore(url=openbao.url, token=openbao.token, mount="nowhere")
    path = path_of(a_person(), "github")
    with pytest.raises(VaultStoreError) as error:
        store.read(path)
    route = f'no handler for route "nowhere/data/{path}". route entry not found.'
    assert str(error.value) == f"Vault could not read nowhere/{path}: InvalidPath: {route}"


def test_an_unreachable_vault_gives_an_error_that_names_the_path_and_the_cause_only():
    port = free_port()  # nothing listens there
    store = VaultStore(url=f"http://127.0.0.1:{port}", token=CANARY, mount="secret")
    path = path_of(a_person(), "github")
    with pytest.raises(VaultStoreError) as error:
        store.write(path, {"access_token": CANARY})
    cause = f"cannot reach http://127.0.0.1:{port} (Connection refused)"
    assert str(error.value) == f"Vault could not write secret/{path}: {cause}"
    assert CANARY not in str(error.value)


def test_a_vault_that_never_answers_gives_a_timeout_error_within_the_bound():
    silent = SilentServer()
    try:
        store = VaultStore(url=silent.url.removesuffix("/mcp"), token=CANARY, mount="secret", timeout=(1.0, 0.5))
        path = path_of(a_person(), "github")
        with pytest.raises(VaultStoreError) as error:
            store.read(path)
        where = silent.url.removesuffix("/mcp")
        cause = f"no answer from {where} within 1 s to connect or 0.5 s to reply"
        assert str(error.value) == f"Vault could not read secret/{path}: {cause}"
        assert CANARY not in str(error.value)
    finally:
        silent.close()


def test_a_vault_url_with_a_password_in_it_is_not_repeated_in_errors():
    port = free_port()
    store = VaultStore(url=f"http://user:{CANARY}@127.0.0.1:{port}", token="t", mount="secret")
    with pytest.raises(VaultStoreError, match=rf"cannot reach http://127\.0\.0\.1:{port} \(") as error:
        store.read(path_of(a_person(), "github"))
    assert CANARY not in str(error.value)


@pytest.mark.e2e
def test_the_setting_chooses_the_vault_store_and_its_address(openbao, settings):
    settings.GATEWAY_SECRET_STORE, settings.GATEWAY_VAULT_URL = "vault", openbao.url
    settings.GATEWAY_VAULT_TOKEN, settings.GATEWAY_VAULT_MOUNT = openbao.token, "secret"
    secret_store.cache_clear()
    try:
        store = secret_store()
        assert isinstance(store, VaultStore)
        path = path_of(a_person(), "github")
        store.write(path, {"access_token": "sealed-value"})
        shown = openbao.bao("kv", "get", "-field=access_token", "-mount=secret", path)
        assert shown.stdout == "sealed-value"
        store.delete(path)
    finally:
        secret_store.cache_clear()  # the next caller gets the database store of the default settings
