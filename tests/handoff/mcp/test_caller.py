"""When a person's open connection stops serving them (handoff/mcp/caller.py signed_out)."""

import time
from dataclasses import replace

from handoff.mcp.caller import PERSON_DISABLED, TOKEN_EXPIRED, Caller, signed_out
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
