"""Identity providers and people as the routing snapshot reads them, in this process."""

import time

from django.test import override_settings

from policy.config_version import config_version
from policy.identity import CheckedTokens, people_disabled, person_seen, providers_compile
from policy.models import IdentityProvider, Person
from tests.factories import agent


def test_the_settings_provider_and_the_rows_are_compiled_by_issuer_and_a_row_wins(db):
    with agent("staff") as (staff, _key), agent("guests") as (guests, _key2):
        staff_id = staff.id
        IdentityProvider.objects.create(name="idp-a", issuer="https://a.test", agent=guests, scopes="mcp read")
        IdentityProvider.objects.create(name="idp-off", issuer="https://off.test", agent=guests, enabled=False)
        settings = {"GATEWAY_OIDC_ISSUER": "https://s.test", "GATEWAY_OIDC_AGENT": "staff"}
        try:
            with override_settings(**settings, GATEWAY_OIDC_SCOPES=["mcp"], GATEWAY_OIDC_AUDIENCE="api://sb"):
                found = providers_compile()
            guests.enabled = False
            guests.save()
            with override_settings(GATEWAY_OIDC_ISSUER="https://a.test", GATEWAY_OIDC_AGENT="staff"):
                overridden = providers_compile()
        finally:
            IdentityProvider.objects.filter(issuer__in=["https://a.test", "https://off.test"]).delete()
    assert sorted(found) == ["https://a.test", "https://s.test"]
    assert (found["https://s.test"].agent_id, found["https://s.test"].audience) == (staff_id, "api://sb")
    assert found["https://s.test"].scopes == frozenset({"mcp"})
    assert (found["https://a.test"].agent_name, found["https://a.test"].scopes) == ("guests", {"mcp", "read"})
    assert overridden["https://a.test"].agent_id is None  # the row wins, and its agent is disabled


def test_meeting_a_person_records_them_without_a_new_configuration_and_disabling_them_moves_it(db):
    before = config_version()
    person_seen("https://p.test", "ann", "Ann")
    person_seen("https://p.test", "ann", "Ann B")
    person = Person.objects.get(issuer="https://p.test", subject="ann")
    assert (person.name, person.first_seen <= person.last_seen) == ("Ann B", True)
    assert config_version() == before  # meeting someone changes nothing routing reads
    person.enabled = False
    person.save()
    try:
        assert config_version() > before
        assert ("https://p.test", "ann") in people_disabled()
    finally:
        person.delete()


def test_checked_tokens_are_forgotten_when_their_time_is_up_and_the_oldest_go_first():
    memory = CheckedTokens(capacity=2)
    now = time.time()
    keys = [CheckedTokens.key(1, "https://gw.test/mcp", f"token-{n}") for n in range(3)]
    memory.put(keys[0], "first", now + 60)
    memory.put(keys[1], None, now + 60)  # a lookup that found nobody is remembered too
    memory.put(keys[2], "expired", now - 1)
    assert memory.get(keys[1]) == (True, None)
    assert memory.get(keys[2]) == (False, None)
    assert memory.get(keys[0]) == (False, None)  # pushed out by the third
    assert CheckedTokens.key(2, "https://gw.test/mcp", "token-0") != keys[0]  # a new configuration forgets
