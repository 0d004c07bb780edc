"""Personal credentials without a server: stored sealed, versioned, revoked, found for a call; put where the
upstream takes them; and the connect link signed for one person and one upstream."""

import io
import json
from contextlib import contextmanager

import anyio
import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection

from audit.models import AuditEvent
from policy.identity import person_digest
from policy.models import Team
from registry.models import PersonalCredential, SealedSecret, Upstream
from registry.personal import (
    CREDENTIAL_EXPIRED,
    CREDENTIAL_REVOKED,
    connect_link,
    connect_link_person,
    credential_path,
    personal_connect,
    personal_disconnect,
    personal_refresh_failed,
    personal_revoke,
    personal_state,
)
from registry.secret_store import secret_path, secret_store, secrets_seal
from registry.upstreams.person import CredentialUnusable, person_spec, slotted
from registry.upstreams.spec import UpstreamSpec
from tests.helpers import audit_mark

pytestmark = pytest.mark.django_db
ALICE = {"issuer": "https://idp.example.com", "subject": "alice", "name": "Alice"}
TOKEN = "alice-personal-token-91c2"


@pytest.fixture
def upstream() -> Upstream:
    row = Upstream.objects.create(
        slug="ledger", transport="streamable_http", url="http://127.0.0.1:9/mcp", internal=True, per_person=True
    )
    yield row
    row.delete()


def test_a_connection_is_stored_sealed_and_each_change_bumps_its_version(upstream):
    mark = audit_mark()  # other tests' rows may name an upstream 'ledger' too
    first = personal_connect(upstream=upstream, kind="token", values={"token": TOKEN}, **ALICE)
    stored = SealedSecret.objects.get(path=credential_path(upstream, ALICE["issuer"], ALICE["subject"]))
    assert (
        stored.path == f"tenants/default/teams/default/users/{person_digest(ALICE['issuer'], ALICE['subject'])}/ledger"
    )
    assert TOKEN not in json.dumps(stored.values) and stored.values["token"].startswith("sbx1:")
    assert personal_state(upstream.id, ALICE["issuer"], ALICE["subject"]) == (first.pk, "token", 1, "")
    again = personal_connect(upstream=upstream, kind="token", values={"token": TOKEN + "2"}, **ALICE)
    assert (again.pk, again.version) == (first.pk, 2)
    rows = AuditEvent.objects.filter(id__gt=mark, kind="admin_change", upstream="ledger").order_by("id")
    assert [(r.detail["action"], r.detail["credential"], r.person_subject) for r in rows] == [
        ("credential_connected", {"id": first.pk, "kind": "token"}, "alice")
    ] * 2
    assert TOKEN not in json.dumps([r.detail for r in rows])


def test_revoked_and_expired_credentials_say_so_and_disconnect_forgets(upstream):
    stored = SealedSecret.objects.filter(path=credential_path(upstream, ALICE["issuer"], ALICE["subject"]))
    credential = personal_connect(upstream=upstream, kind="token", values={"token": TOKEN}, **ALICE)
    personal_revoke(credential, actor="operator")
    revoked = AuditEvent.objects.filter(kind="admin_change", upstream="ledger").latest("id")
    assert (revoked.actor, revoked.detail["action"]) == ("operator", "credential_revoked")
    assert personal_state(upstream.id, ALICE["issuer"], ALICE["subject"])[2:] == (2, CREDENTIAL_REVOKED)
    assert not stored.exists()
    credential = personal_connect(upstream=upstream, kind="token", values={"token": TOKEN}, **ALICE)
    assert personal_state(upstream.id, ALICE["issuer"], ALICE["subject"])[3] == ""  # connecting again lifts it
    PersonalCredential.objects.filter(pk=credential.pk).update(refresh_failed_at="2026-01-01T00:00:00Z")
    assert personal_state(upstream.id, ALICE["issuer"], ALICE["subject"])[3] == CREDENTIAL_EXPIRED
    personal_disconnect(PersonalCredential.objects.get(pk=credential.pk))
    assert AuditEvent.objects.filter(upstream="ledger").latest("id").detail["action"] == "credential_disconnected"
    assert personal_state(upstream.id, ALICE["issuer"], ALICE["subject"]) is None
    assert not stored.exists()


@contextmanager
def _audit_refused():
    """The database refuses every new audit row, as a full disk or a lost connection would refuse it."""
    table = connection.ops.quote_name(AuditEvent._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} ADD CONSTRAINT test_refused CHECK (false) NOT VALID")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT test_refused")


@pytest.mark.django_db(transaction=True)  # each change commits on its own, as in the console
def test_a_change_to_a_credential_whose_audit_row_is_refused_does_not_happen(upstream):
    credential = personal_connect(upstream=upstream, kind="token", values={"token": TOKEN}, **ALICE)
    mark = AuditEvent.objects.latest("id").id
    with _audit_refused():
        with pytest.raises(IntegrityError, match="test_refused"):
            personal_revoke(credential, actor="operator")
        with pytest.raises(IntegrityError, match="test_refused"):
            personal_refresh_failed(credential)
        with pytest.raises(IntegrityError, match="test_refused"):
            personal_disconnect(credential)
    kept = PersonalCredential.objects.get(pk=credential.pk)
    assert (kept.revoked_at, kept.refresh_failed_at, kept.version) == (None, None, 1)
    assert not AuditEvent.objects.filter(id__gt=mark).exists()


@pytest.mark.django_db(transaction=True)  # the executor reads in threads of its own, outside the test's transaction
def test_the_executor_opens_the_persons_token_into_its_slot(upstream):
    credential = personal_connect(upstream=upstream, kind="token", values={"token": TOKEN}, **ALICE)
    ref = {"person": person_digest(ALICE["issuer"], ALICE["subject"]), "kind": "token", "version": "1"}
    spec = anyio.run(person_spec, upstream, ref | {"id": credential.pk})
    assert spec.headers == {"Authorization": f"Bearer {TOKEN}"}
    assert (spec.person_credential, spec.person_version) == (credential.pk, "1")  # what a reused connection holds
    assert TOKEN in spec.secrets  # so whatever the upstream says is scrubbed of it
    assert PersonalCredential.objects.get(pk=credential.pk).last_used_at is not None
    with pytest.raises(CredentialUnusable) as nobody:
        anyio.run(person_spec, upstream, None)
    assert nobody.value.code == "PERSON_REQUIRED"
    with pytest.raises(CredentialUnusable) as gone:
        anyio.run(person_spec, upstream, ref | {"id": credential.pk + 1000})
    assert (gone.value.code, gone.value.message) == (
        "CREDENTIAL_REQUIRED",
        "No credential of yours for ledger: connect it.",
    )


@pytest.mark.django_db(transaction=True)
def test_a_value_moved_to_another_persons_path_does_not_open(upstream):
    personal_connect(upstream=upstream, kind="token", values={"token": TOKEN}, **ALICE)
    bob = personal_connect(
        upstream=upstream, kind="token", values={"token": "bob-token-77aa"}, **ALICE | {"subject": "bob"}
    )
    alice_path = credential_path(upstream, ALICE["issuer"], "alice")
    bob_path = credential_path(upstream, ALICE["issuer"], "bob")
    SealedSecret.objects.filter(path=bob_path).update(values=SealedSecret.objects.get(path=alice_path).values)
    ref = {"person": person_digest(ALICE["issuer"], "bob"), "kind": "token", "version": "1", "id": bob.pk}
    with pytest.raises(CredentialUnusable) as moved:
        anyio.run(person_spec, upstream, ref)
    assert moved.value.message == "Your credential for ledger is unusable: connect again."


@pytest.mark.parametrize(
    ("slot", "field", "expected"),
    [
        ("bearer", "headers", {"Authorization": "Bearer t0k"}),
        ("header:X-Api-Key", "headers", {"X-Api-Key": "t0k"}),
        ("query:api_key", "query", {"api_key": "t0k"}),
        ("env:GITHUB_TOKEN", "env", {"GITHUB_TOKEN": "t0k"}),
    ],
)
def test_each_slot_puts_the_token_where_it_says(slot, field, expected):
    spec = UpstreamSpec(id=1, revision=1, slug="s", transport="stdio", timeout=1.0)
    assert getattr(slotted(spec, slot, "t0k", 0.0, "3"), field) == expected


def test_a_connect_link_opens_only_for_its_person_and_upstream():
    link = connect_link("https://gw.example.com", "ledger", ALICE["issuer"], ALICE["subject"])
    assert link.startswith("https://gw.example.com/account/connections/ledger/?for=")
    made_for = link.split("for=", 1)[1]
    assert connect_link_person("ledger", made_for) == person_digest(ALICE["issuer"], ALICE["subject"])
    assert connect_link_person("payroll", made_for) is None  # not for another upstream
    assert connect_link_person("ledger", made_for[:-2] + "xx") is None


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"transport": "stdio", "command": "x", "person_slot": "bearer"}, "env:<NAME>"),
        ({"person_slot": "env:TOKEN"}, "bearer, header:<Name> or query:<name>."),
        ({"person_connect": "exchange"}, "Token exchange needs its token endpoint and a client."),
        ({"person_connect": "oauth", "person_slot": "header:X"}, "OAuth and token exchange give a bearer token."),
    ],
)
def test_a_per_person_upstream_is_checked_before_it_is_saved(fields, error):
    row = Upstream(slug="checked", transport="streamable_http", url="http://127.0.0.1:9/mcp", internal=True)
    row.per_person = True
    for name, value in fields.items():
        setattr(row, name, value)
    with pytest.raises(ValidationError) as refused:
        row.full_clean()
    assert error in str(refused.value)


def _opened(upstream: Upstream, credential: PersonalCredential) -> str:
    """The token the executor puts into the call, read from wherever the credential's row says it is."""
    ref = {"person": person_digest(ALICE["issuer"], ALICE["subject"]), "kind": "token", "id": credential.pk}
    return anyio.run(person_spec, upstream, ref).headers["Authorization"]


def _moved() -> str:
    """What `manage.py move_credentials` says."""
    out = io.StringIO()
    call_command("move_credentials", stdout=out)
    return out.getvalue().strip()


@pytest.mark.django_db(transaction=True)  # the executor reads in threads of its own, outside the test's transaction
def test_a_credential_stored_before_teams_is_used_where_it_is_until_the_command_moves_it_under_its_team(upstream):
    person = person_digest(ALICE["issuer"], ALICE["subject"])
    legacy = secret_path(team="", person=person, service="ledger")
    assert legacy == f"tenants/default/users/{person}/ledger"
    secret_store().write(legacy, secrets_seal(legacy, {"token": TOKEN}))
    credential = PersonalCredential.objects.create(upstream=upstream, kind="token", secret_team="", **_person())
    assert _opened(upstream, credential) == f"Bearer {TOKEN}"
    mark = audit_mark()
    assert _moved() == "moved 1 credential(s) to their upstream's team's path"
    assert PersonalCredential.objects.get(pk=credential.pk).secret_team == "default"
    assert not SealedSecret.objects.filter(path=legacy).exists()
    assert SealedSecret.objects.filter(path=f"tenants/default/teams/default/users/{person}/ledger").exists()
    assert _opened(upstream, PersonalCredential.objects.get(pk=credential.pk)) == f"Bearer {TOKEN}"
    assert _moved() == "moved 0 credential(s) to their upstream's team's path"  # re-runnable
    rows = AuditEvent.objects.filter(id__gt=mark, detail__action="credentials_moved").order_by("id")
    assert [(row.actor, row.team, row.detail["credentials"]) for row in rows] == [
        ("manage.py move_credentials", "default", 1),  # under the team whose credentials moved
        ("manage.py move_credentials", "", 0),  # none moved: concerns no team
    ]


@pytest.mark.django_db(transaction=True)
def test_a_credential_of_an_upstream_given_to_another_team_stays_usable_and_moves_with_the_command(upstream):
    credential = personal_connect(upstream=upstream, kind="token", values={"token": TOKEN}, **ALICE)
    old = credential_path(upstream, ALICE["issuer"], ALICE["subject"])
    payments = Team.objects.create(slug="payments", name="Payments")
    try:
        Upstream.objects.filter(pk=upstream.pk).update(team=payments)
        upstream.refresh_from_db()
        assert _opened(upstream, credential) == f"Bearer {TOKEN}"  # still where its row says
        assert _moved() == "moved 1 credential(s) to their upstream's team's path"
        new = credential_path(upstream, ALICE["issuer"], ALICE["subject"])
        assert new.startswith("tenants/default/teams/payments/users/") and new != old
        assert (SealedSecret.objects.filter(path=old).exists(), SealedSecret.objects.filter(path=new).exists()) == (
            False,
            True,
        )
        assert _opened(upstream, PersonalCredential.objects.get(pk=credential.pk)) == f"Bearer {TOKEN}"
    finally:
        Upstream.objects.filter(pk=upstream.pk).update(team=Team.objects.get(slug="default"))
        payments.delete()


@pytest.mark.django_db(transaction=True)
def test_connecting_again_after_the_upstream_changed_teams_leaves_nothing_at_the_old_path(upstream):
    personal_connect(upstream=upstream, kind="token", values={"token": TOKEN}, **ALICE)
    old = credential_path(upstream, ALICE["issuer"], ALICE["subject"])
    payments = Team.objects.create(slug="payments", name="Payments")
    try:
        Upstream.objects.filter(pk=upstream.pk).update(team=payments)
        upstream.refresh_from_db()
        credential = personal_connect(upstream=upstream, kind="token", values={"token": TOKEN + "2"}, **ALICE)
        assert credential.secret_team == "payments" and not SealedSecret.objects.filter(path=old).exists()
        assert _opened(upstream, credential) == f"Bearer {TOKEN}2"
    finally:
        Upstream.objects.filter(pk=upstream.pk).update(team=Team.objects.get(slug="default"))
        payments.delete()


@pytest.mark.django_db(transaction=True)
def test_a_value_that_does_not_open_stops_the_move_naming_it_and_what_was_moved_stays_moved(upstream):
    person = person_digest(ALICE["issuer"], ALICE["subject"])
    legacy = secret_path(team="", person=person, service="ledger")
    elsewhere = secret_path(team="", person=person, service="other")
    secret_store().write(legacy, secrets_seal(elsewhere, {"token": TOKEN}))  # sealed for another path
    credential = PersonalCredential.objects.create(upstream=upstream, kind="token", secret_team="", **_person())
    with pytest.raises(CommandError) as stopped:
        _moved()
    assert str(stopped.value).startswith("stopped: ")
    assert str(stopped.value).endswith("; what was moved is in place, run it again to move the rest")
    assert "does not open" in str(stopped.value) and TOKEN not in str(stopped.value)
    assert PersonalCredential.objects.get(pk=credential.pk).secret_team == ""
    assert SealedSecret.objects.filter(path=legacy).exists()


def _person() -> dict[str, str]:
    return {"person_issuer": ALICE["issuer"], "person_subject": ALICE["subject"], "person_name": ALICE["name"]}
