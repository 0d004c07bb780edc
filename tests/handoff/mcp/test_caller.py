"""When a person's open connection stops serving them (handoff/mcp/caller.py signed_out)."""

import json
import time
from dataclasses import replace

from handoff.mcp.caller import PERSON_DISABLED, TOKEN_EXPIRED, Caller, header, signed_out
from handoff.snapshot import Snapshot


def test_a_token_that_expires_or_a_person_disabled_signs_the_connection_out_and_a_personal_key_does_not():
    person = Caller(agent_id=5, agent_name="people", transport="ws", key_prefix="", person_issuer="https://idp.test",
                    person_subject="grace", expires_at=time.time() + 60)  # fmt: skip
    snap = Snapshot(version=1)
    assert signed_out(person, snap) == ""
    assert signed_out(replace(person, expires_at=time.time() - 1), snap) == TOKEN_EXPIRED
    assert (
        signed_out(person, replace(snap, people_disabled=frozenset({("https://idp.test", "grace")}))) == PERSON_DISABLED
    )
    personal_key = replace(person, key_prefix="abc", expires_at=0.0)  # a key's owner: no token to expire
    assert signed_out(personal_key, snap) == ""


def test_a_caller_crosses_to_a_worker_with_its_token_sealed_and_out_of_its_repr():
    token = "eyJhbGciOiJSUzI1NiJ9.person-token.signature"
    caller = Caller(7, "people", "http", "", person_issuer="https://idp", person_subject="ada", token=token)
    caller = replace(caller, key_tools=("a__*",), groups=(3,))
    assert token not in repr(caller)
    wire = json.loads(json.dumps(caller.wire()))  # as a Celery task carries it
    assert token not in json.dumps(wire) and wire["token"].startswith("sbx1:")
    assert Caller.from_wire(wire) == caller
    assert Caller.from_wire(json.loads(json.dumps(replace(caller, token="").wire()))).token == ""


def test_a_header_is_read_from_the_scope_s_headers_as_they_are_now_the_first_of_a_repeated_one():
    scope = {"headers": [(b"host", b"a.test"), (b"X-Seen", b"one"), (b"x-seen", b"two")]}
    assert header(scope, b"x-seen") == "one" and header(scope, b"origin") is None
    scope["headers"] = [(b"host", b"b.test")]  # a middleware's new list: read afresh
    assert header(scope, b"host") == "b.test" and header(scope, b"x-seen") is None
