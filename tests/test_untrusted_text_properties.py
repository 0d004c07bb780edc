"""Properties of the functions that clean what upstreams say, over generated input rather than examples."""

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from policy.manifest import RESERVED_NAMES, TOOL_NAME, clean_text, tool_name_problem
from policy.redaction import redact

HIDDEN = ("Cc", "Cf", "Cs", "Co")


@given(st.text(), st.integers(min_value=1, max_value=300))
def test_cleaned_text_hides_nothing_and_fits_its_limit(text, limit):
    cleaned = clean_text(text, limit)
    assert len(cleaned) <= limit
    assert "\x1b" not in cleaned
    assert all(c in "\n\t" or unicodedata.category(c) not in HIDDEN for c in cleaned)


@given(st.text())
def test_cleaning_twice_changes_nothing(text):
    once = clean_text(text, 10_000)
    assert clean_text(once, 10_000) == once


@given(st.text())
def test_a_name_is_accepted_only_if_it_is_a_plain_tool_name(name):
    if tool_name_problem(name) is None:
        assert TOOL_NAME.fullmatch(name) and name.isascii() and name not in RESERVED_NAMES


@given(
    st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)),
    st.integers(min_value=1, max_value=65535),
    st.sampled_from(["connect to {} failed", "refused by {} (try later)", "{}: timeout", "upstream at {}"]),
)
def test_no_address_survives_redaction(address, port, template):
    shown = f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"
    for text in (template.format(address), template.format(shown)):
        assert str(address) not in redact(text), text


@given(st.from_regex(r"[A-Za-z0-9_\-]{24,64}", fullmatch=True), st.sampled_from(["token", "api_key", "secret"]))
def test_no_assigned_secret_survives_redaction(value, name):
    assert value not in redact(f"request failed: {name}={value}; retry later")
