"""Both homes of admission state apply the same rules: Redis (shared by processes) and the embedded default's
memory. The same scenarios run against each."""

import time
from dataclasses import replace

import anyio
import pytest
import redis

from policy.limits.admission import Admission, TeamLimits, Verdict, limits_denial
from policy.limits.stores import LocalLimitStore, RedisLimitStore
from tests.conftest import needs
from tests.factories import admission, team_limits


@pytest.fixture(params=["redis", "local"])
def store(request, settings, shared_state):
    if request.param == "redis":
        needs(bool(settings.REDIS_URL), "REDIS_URL is not set")
        return RedisLimitStore()
    return LocalLimitStore()


def admit_all(store, admissions: list[Admission]) -> list[str]:
    async def scenario() -> list[str]:
        return [(await store.admit(a)).code for a in admissions]

    return anyio.run(scenario)


def release(store, a: Admission, health: str, probing: bool = False) -> None:
    anyio.run(store.release, a, health, probing)


def test_a_session_locked_to_a_strict_group_keeps_out_of_other_strict_groups(store):
    a = admission(strict_group=1)
    in_group = [replace(a, upstream=replace(a.upstream, strict_group=group)) for group in (None, 2, 1)]
    codes = admit_all(store, [a, *in_group])
    assert codes == ["", "", "POLICY_GROUP_ISOLATION", ""]


def test_an_agents_window_counts_only_admitted_calls(store):
    a = admission(agent={"calls_per_minute": 2})
    codes = admit_all(store, [replace(a, request_id=f"{a.request_id}-{i}") for i in range(4)])
    assert codes == ["", "", "AGENT_RATE_LIMITED", "AGENT_RATE_LIMITED"]


def test_an_upstreams_window_counts_the_calls_of_every_agent_and_session(store):
    a = admission(calls_per_minute=2)
    others = [replace(admission(), upstream=a.upstream) for _ in range(2)]  # other agents, other sessions
    verdicts = anyio.run(lambda: _admit_each(store, [a, *others]))
    assert [v.code for v in verdicts] == ["", "", "UPSTREAM_RATE_LIMITED"]
    assert 59 < verdicts[2].retry_after <= 60, "until the oldest call leaves the minute"


def test_a_strict_groups_lock_holds_its_own_session_only(store):
    vault = admission(strict_group=1)
    mailer = replace(vault, request_id=f"{vault.request_id}-out", upstream=replace(vault.upstream, strict_group=2))
    other_session = replace(mailer, request_id=f"{vault.request_id}-new", session=f"{vault.session}-new")
    assert admit_all(store, [vault, mailer, other_session]) == ["", "POLICY_GROUP_ISOLATION", ""]


def test_a_refused_call_takes_no_share_of_any_limit(store):
    """Had either refusal counted, the second admitted call would be refused: two calls fill the session and the
    agent's minute."""
    a = admission(agent={"calls_per_minute": 2, "max_calls_per_session": 2}, strict_group=1, max_concurrent=1)
    elsewhere = replace(a, request_id=f"{a.request_id}-out", upstream=replace(a.upstream, strict_group=2))
    assert admit_all(store, [a, elsewhere, replace(a, request_id=f"{a.request_id}-busy")]) == [
        "",
        "POLICY_GROUP_ISOLATION",
        "UPSTREAM_BUSY",
    ]
    release(store, a, "ok")
    assert admit_all(store, [replace(a, request_id=f"{a.request_id}-2")]) == [""]
    release(store, a, "ok")
    assert admit_all(store, [replace(a, request_id=f"{a.request_id}-3")]) == ["SESSION_CALL_LIMIT"]


def test_sessions_and_concurrency_are_capped_and_a_release_frees_a_slot(store):
    a = admission(agent={"max_calls_per_session": 3}, max_concurrent=1)
    assert admit_all(store, [a, replace(a, request_id="second")]) == ["", "UPSTREAM_BUSY"]
    release(store, a, "ok")
    assert admit_all(store, [replace(a, request_id="third")]) == [""]
    release(store, a, "ok")
    assert admit_all(store, [replace(a, request_id="fourth"), replace(a, request_id="fifth")]) == [
        "",
        "SESSION_CALL_LIMIT",
    ]


def admitted_once_window_ends(store, a: Admission, busy: Admission, busy_code: str) -> None:
    """Returns once `a` is admitted, while the key also tries `busy` every 50 ms, answered `busy_code`; a window
    that busy use extended would never end, so a bound of five windows fails it."""
    started = time.monotonic()
    while time.monotonic() - started < 5:
        if admit_all(store, [a]) == [""]:
            return
        # "" too: the window may end between the two tries.
        assert admit_all(store, [replace(busy, request_id=f"busy-{time.monotonic()}")])[0] in (busy_code, "")
        time.sleep(0.05)
    raise AssertionError("still refused 5 s after a window of 1 s")


def test_a_stateless_keys_calls_are_counted_in_a_fixed_window_that_busy_use_does_not_extend(store, settings):
    settings.GATEWAY_STATELESS_WINDOW_SECONDS = 1
    a = admission(agent={"max_calls_per_session": 2}, strict_group=None)
    a = replace(a, stateless=True)
    verdicts = anyio.run(lambda: _admit_each(store, [replace(a, request_id=f"r{i}") for i in range(3)]))
    assert [v.code for v in verdicts] == ["", "", "KEY_CALL_LIMIT"]
    assert 0 < verdicts[2].retry_after <= 1
    # Refused calls go on meanwhile: they do not push the window's end.
    admitted_once_window_ends(store, replace(a, request_id="after"), a, "KEY_CALL_LIMIT")


def test_a_stateless_keys_strict_group_lock_ends_with_its_window_though_the_key_stays_busy(store, settings):
    settings.GATEWAY_STATELESS_WINDOW_SECONDS = 1
    vault = replace(admission(strict_group=1), stateless=True)
    mailer = replace(vault, request_id="out", upstream=replace(vault.upstream, strict_group=2))
    [entered, refused] = anyio.run(lambda: _admit_each(store, [vault, mailer]))
    assert (entered.code, refused.code) == ("", "POLICY_GROUP_ISOLATION")
    assert 0 < refused.retry_after <= 1
    # The key keeps calling into the vault group all the while: the lock still ends with its window.
    admitted_once_window_ends(store, mailer, vault, "")


def test_the_breaker_opens_after_its_failures_lets_one_probe_through_and_closes_on_success(store):
    a = admission()
    for _ in range(2):
        assert admit_all(store, [a]) == [""]
        release(store, a, "fail")
    assert store.breaker(a.upstream.id).state == "open"
    assert admit_all(store, [a]) == ["UPSTREAM_CIRCUIT_OPEN"]
    deadline = time.monotonic() + 5
    while store.breaker(a.upstream.id).state != "half-open" and time.monotonic() < deadline:
        time.sleep(0.05)

    async def probe_and_follower():
        return await store.admit(a), await store.admit(a)

    probe, follower = anyio.run(probe_and_follower)
    assert (probe.code, probe.probing) == ("", True)
    assert follower.code == "UPSTREAM_CIRCUIT_OPEN", "one probe at a time"
    release(store, a, "ok", probing=True)
    assert (store.breaker(a.upstream.id).state, admit_all(store, [a])) == ("closed", [""])


def test_neutral_outcomes_neither_open_nor_close_the_breaker(store):
    a = admission(breaker_failures=1)
    admit_all(store, [a])
    release(store, a, "none")
    assert store.breaker(a.upstream.id).state == "closed"


def test_without_redis_admission_is_refused_as_limits_unavailable(settings):
    """Nothing listens on the port: the call is not admitted unchecked."""
    from tests import servers

    settings.REDIS_URL = f"redis://127.0.0.1:{servers.free_port()}/0"
    a = admission()
    [verdict] = anyio.run(lambda: _admit_one(RedisLimitStore(), a))
    denial = limits_denial(a, verdict, "up__tool")
    assert (verdict.code, verdict.retry_after) == ("LIMITS_UNAVAILABLE", 1.0)
    assert (denial.jsonrpc_code, denial.data()) == (-32003, {"code": "LIMITS_UNAVAILABLE", "retryAfter": 1.0})
    assert (
        denial.message
        == "The gateway cannot check its limits right now, so 'up__tool' was not run. Retry after 1 second."
    )


async def _admit_one(store, a):
    return [await store.admit(a)]


async def _admit_each(store, admissions: list[Admission]) -> list:
    return [await store.admit(a) for a in admissions]


def test_what_an_outcome_tells_the_breaker():
    from policy.limits.admission import health_of

    readings = {
        code: health_of(code) for code in ("", "TOOL_ERROR", "UPSTREAM_TIMEOUT", "HANDOFF_UPSTREAM_UNAVAILABLE")
    }
    # A lost tunnel may be the worker's death, not the specialist's fault: it neither opens nor closes the circuit.
    assert readings == {
        "": "ok",
        "TOOL_ERROR": "ok",
        "UPSTREAM_TIMEOUT": "fail",
        "HANDOFF_UPSTREAM_UNAVAILABLE": "none",
    }


def test_each_failed_probe_doubles_how_long_the_circuit_stays_open_up_to_the_recovery_time(store, settings):
    settings.GATEWAY_BREAKER_FIRST_OPEN_SECONDS = 0.2
    a = admission(breaker_failures=1, breaker_recovery=0.6)
    admit_all(store, [a])
    release(store, a, "fail")
    opened_for = [store.breaker(a.upstream.id).retry_after]
    for _ in range(3):
        deadline = time.monotonic() + 5
        while (probe := anyio.run(store.admit, a)).code and time.monotonic() < deadline:
            time.sleep(0.02)
        assert probe.probing
        release(store, a, "fail", probing=True)
        opened_for.append(store.breaker(a.upstream.id).retry_after)
    # Each reading is taken just after the circuit opened: a little under what it opened for.
    expected = [0.2, 0.4, 0.6, 0.6]
    assert all(want - 0.1 < got <= want for got, want in zip(opened_for, expected, strict=True)), opened_for
    release(store, a, "ok")
    assert store.breaker(a.upstream.id).state == "closed"


def teammates(team: TeamLimits, count: int, **upstream) -> list[Admission]:
    """Calls of `count` agents of `team`, each in its own session, to one upstream."""
    first = admission(agent={"team": team}, **upstream)
    others = [admission(agent={"team": team}) for _ in range(count - 1)]
    return [first, *(replace(a, upstream=first.upstream) for a in others)]


def test_a_teams_window_counts_the_admitted_calls_of_all_its_agents(store):
    """Two calls a minute for the team: the first agent's second call is refused by its own rate, so counts for
    nothing, and the second agent still gets the team's second call."""
    team = team_limits(calls_per_minute=2)
    first, second = teammates(team, 2)
    first = replace(first, agent=replace(first.agent, calls_per_minute=1))
    calls = [first, replace(first, request_id="again"), second, replace(second, request_id="third")]
    verdicts = anyio.run(lambda: _admit_each(store, calls))
    assert [v.code for v in verdicts] == ["", "AGENT_RATE_LIMITED", "", "TEAM_RATE_LIMITED"]
    assert 59 < verdicts[3].retry_after <= 60, "until the team's oldest call leaves the minute"


def test_a_call_refused_by_its_team_counts_against_no_other_limit(store):
    team = team_limits(calls_per_minute=1)
    a = admission(agent={"calls_per_minute": 2, "max_calls_per_session": 2, "team": team})
    assert admit_all(store, [a, replace(a, request_id="refused")]) == ["", "TEAM_RATE_LIMITED"]
    # Had the refusal counted, the agent's minute and the session would be full now.
    roomier = replace(a, request_id="later", agent=replace(a.agent, team=replace(team, calls_per_minute=5)))
    assert admit_all(store, [roomier]) == [""]


def test_a_teams_calls_at_once_are_capped_across_upstreams_and_a_release_gives_a_slot_back(store):
    team = team_limits(max_concurrent=1)
    running = admission(agent={"team": team})
    elsewhere = admission(agent={"team": team})  # another agent of the team, another upstream
    verdicts = anyio.run(lambda: _admit_each(store, [running, elsewhere]))
    assert [(v.code, v.retry_after) for v in verdicts] == [("", 0.0), ("TEAM_BUSY", 1.0)]
    release(store, running, "ok")
    assert admit_all(store, [replace(elsewhere, request_id="now")]) == [""]


def test_a_teams_daily_budget_counts_admitted_calls_until_the_utc_day_ends(store):
    """The call refused as busy does not spend the budget; a release gives back concurrency, not budget."""
    team = team_limits(daily_calls=2)
    first = admission(agent={"team": team}, max_concurrent=1)
    busy = replace(first, request_id="busy")
    assert admit_all(store, [first, busy]) == ["", "UPSTREAM_BUSY"]
    release(store, first, "ok")
    assert admit_all(store, [replace(first, request_id="second")]) == [""]
    release(store, first, "ok")
    until_midnight_before = 86_400 - time.time() % 86_400
    [refused] = anyio.run(lambda: _admit_one(store, replace(first, request_id="third")))
    until_midnight_after = 86_400 - time.time() % 86_400
    assert refused.code == "TEAM_DAILY_BUDGET"
    # Redis reads its own clock, the same machine's: a millisecond either side.
    assert until_midnight_after - 0.001 <= refused.retry_after <= until_midnight_before + 0.001


def test_a_borrower_holds_at_most_half_a_shared_upstreams_calls_at_once_while_the_owner_still_gets_calls(store):
    owner, borrower = team_limits(), team_limits()
    shared = admission(agent={"team": owner}, max_concurrent=4, team=owner.id).upstream
    borrowed = [replace(a, upstream=shared) for a in teammates(borrower, 3)]
    owned = [replace(a, upstream=shared) for a in teammates(owner, 3)]
    assert admit_all(store, borrowed) == ["", "", "UPSTREAM_SHARE_BUSY"]
    assert admit_all(store, owned) == ["", "", "UPSTREAM_BUSY"], "the owner has the other half"
    release(store, owned[0], "ok")
    assert admit_all(store, [replace(borrowed[2], request_id="still")]) == ["UPSTREAM_SHARE_BUSY"]
    release(store, borrowed[0], "ok")
    assert admit_all(store, [replace(borrowed[2], request_id="freed")]) == [""]


def test_a_borrowers_share_is_half_the_upstreams_calls_at_once_and_at_least_one():
    shares = {n: replace(admission().upstream, max_concurrent=n).share for n in (1, 2, 5, 64)}
    assert shares == {1: 1, 2: 1, 5: 2, 64: 32}


@pytest.mark.parametrize(
    ("code", "retry_after", "message"),
    [
        (
            "TEAM_RATE_LIMITED",
            42.5,
            "Team 'payments' may make 3 tool calls a minute, all its agents together. Retry after 43 seconds.",
        ),
        ("TEAM_BUSY", 1.0, "Team 'payments' is running its maximum of 4 calls at once. Retry after 1 second."),
        (
            "TEAM_DAILY_BUDGET",
            3600.0,
            "Team 'payments' has made the 5 tool calls it may make today; its budget renews at 00:00 UTC. "
            "Retry after 3600 seconds.",
        ),
        (
            "UPSTREAM_SHARE_BUSY",
            1.0,
            "The service 'up' is shared with team 'payments', which may run 3 of its calls at once and is running "
            "them. Retry after 1 second.",
        ),
    ],
)
def test_each_team_refusal_names_the_team_and_its_limit_and_says_when_to_retry(code, retry_after, message):
    team = team_limits(slug="payments", calls_per_minute=3, max_concurrent=4, daily_calls=5)
    a = admission(agent={"team": team}, max_concurrent=6, team=team.id + 1)
    denial = limits_denial(a, Verdict(code, retry_after), "up__tool")
    assert (denial.jsonrpc_code, denial.data(), denial.message) == (
        -32003,
        {"code": code, "retryAfter": retry_after},
        message,
    )


def test_an_admission_expecting_keys_admits_while_they_hold_renewing_them_and_takes_nothing_once_one_changed(
    settings, shared_state
):
    """`Admission.expected` (Redis only): the session's state a call ran on unread (handoff/mcp/unverified.py)."""
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set")
    store, client = RedisLimitStore(), redis.Redis.from_url(settings.REDIS_URL)
    record, entry = f"{settings.GATEWAY_REDIS_PREFIX}test-record", f"{settings.GATEWAY_REDIS_PREFIX}test-entry"
    client.set(record, b"as read", ex=5)
    client.delete(entry)
    a = admission(agent={"calls_per_minute": 10})
    holding = replace(a, expected=((record, b"as read", 600), (entry, None, 0)))
    changed = replace(holding, request_id=f"{a.request_id}-2", expected=((record, b"as read", 600), (entry, b"x", 0)))
    other = replace(holding, request_id=f"{a.request_id}-3", expected=((record, b"as read earlier", 600),))
    ended = replace(holding, request_id=f"{a.request_id}-4", expected=((f"{record}-gone", b"as read", 600),))
    assert admit_all(store, [holding]) == [""]
    assert client.ttl(record) > 5  # renewed
    assert admit_all(store, [changed, other, ended]) == ["STATE_CHANGED"] * 3
    busy = f"{settings.GATEWAY_REDIS_PREFIX}busy:{a.upstream.id}"
    calls = f"{settings.GATEWAY_REDIS_PREFIX}calls:{a.session}"
    assert (int(client.get(busy)), int(client.get(calls))) == (1, 1)  # the first call's share only
