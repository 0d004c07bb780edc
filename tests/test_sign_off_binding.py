# ruff: noqa: F811 (the fixtures imported from test_sign_off are arguments here)
"""What a sign-off binds (issue 37, scope 2): a grant covers the caller (key, person and client), the upstream and
tool, the arguments' digest, the rule's version and the tool's pinned definition; a call that differs in any of
them is another call, asked for anew, and leaves the grant to the call it covers. And audit_verify covers the
sign-off rows (scope 5): one changed behind the app's back is named."""

import dataclasses

import pytest

from audit.integrity import audit_verify
from audit.models import AuditEvent
from policy.decisions import SignOffTerms
from policy.models import SignOff
from policy.sign_off import arguments_digest, sign_off_decide, sign_off_settle, sign_offs_expire
from tests.factories import agent
from tests.helpers import audit_mark, audit_since
from tests.test_audit_integrity import altered_report
from tests.test_sign_off import approver, asking  # noqa: F401 (a fixture)


@pytest.mark.parametrize(
    ("field", "other"),
    [
        ("key_prefix", "k2"),  # another key of the same agent
        ("client_id", "another-client"),  # the same person through another client
        ("person_subject", "someone-else"),
        ("upstream", "demo-copy"),
        ("tool", "subtract"),
        ("arguments_sha256", arguments_digest({"a": 1, "b": 3})),
        ("definition_sha256", "e" * 64),  # the tool's pinned definition changed
        ("rule_version", 2),  # the rule was saved again
    ],
)
def test_a_grant_covers_only_its_own_call_any_other_is_asked_for_anew(approver, field, other):
    ann, group = approver
    terms = SignOffTerms(1, 1, group.id, False, 60.0, 60.0, False)
    with agent("binding-ola") as (ola, _key):
        signed = asking(ola.id, {"a": 1, "b": 2}, terms, issuer="https://idp", subject="ola")
        granted = sign_off_decide(sign_off_id=str(sign_off_settle(signed).sign_off.id), user=ann, grant=True)
        different = dataclasses.replace(signed, binding=dataclasses.replace(signed.binding, **{field: other}))
        asked = sign_off_settle(different)
        assert (asked.state, asked.sign_off.state) == ("pending", "pending") and asked.sign_off.id != granted.id
        assert SignOff.objects.get(pk=granted.pk).state == "granted"  # untouched by the other call
        assert (sign_off_settle(signed).state, SignOff.objects.get(pk=granted.pk).state) == ("granted", "used")


def test_audit_verify_covers_the_sign_off_rows_and_names_one_changed(approver):
    ann, group = approver
    terms = SignOffTerms(1, 1, group.id, False, 60.0, 60.0, False)
    mark = audit_mark()
    with agent("binding-pia") as (pia, _key):
        granted = sign_off_settle(asking(pia.id, {"a": 1}, terms)).sign_off
        sign_off_decide(sign_off_id=str(granted.id), user=ann, grant=True)
        refused = sign_off_settle(asking(pia.id, {"a": 2}, terms)).sign_off
        sign_off_decide(sign_off_id=str(refused.id), user=ann, grant=False, reason="no")
        expiring = sign_off_settle(asking(pia.id, {"a": 3}, terms)).sign_off
        SignOff.objects.filter(pk=expiring.pk).update(wait_until=expiring.asked_at)
        assert sign_offs_expire() == 1
    rows = {row.kind: row for row in audit_since(mark) if row.kind.startswith("signoff_")}
    assert set(rows) == {"signoff_asked", "signoff_granted", "signoff_refused", "signoff_expired"}
    assert audit_verify().intact
    decision: AuditEvent = rows["signoff_refused"]
    for column, value in [("actor", "someone-else"), ("arguments_sha256", arguments_digest({"a": 9}))]:
        report = altered_report(decision, column, value)
        assert (report.intact, report.first_bad_event) == (False, decision.id), column
    assert audit_verify().intact
