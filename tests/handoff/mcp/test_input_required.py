"""An input-required round's signed state: it comes back only to whom it was given."""

from dataclasses import replace

import pytest

from handoff.mcp.caller import Caller
from handoff.mcp.input_required import InvalidRequestState, state_load, state_sign

GRACE = Caller(agent_id=5, agent_name="people", transport="http", key_prefix="", person_issuer="https://idp.test",
               person_subject="grace")  # fmt: skip


def test_a_rounds_state_loads_for_its_person_and_not_for_another_of_the_same_agent():
    state = state_sign(GRACE, "demo__ask", "demo", asks={"answer": {}})
    assert state_load(GRACE, "demo__ask", "demo", state)["asks"] == {"answer": {}}
    for other in (replace(GRACE, person_subject="mallory"), replace(GRACE, person_subject="", key_prefix="k")):
        with pytest.raises(InvalidRequestState) as refused:
            state_load(other, "demo__ask", "demo", state)
        assert refused.value.error.message == "Invalid requestState: it was issued for another agent or tool."
