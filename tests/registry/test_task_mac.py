"""Work handed to a Celery worker, and its reply, carry a MAC (gateway_project/lib/task_mac.py): whoever can write
to Redis can neither run a call as someone else, replay one, nor forge its result. The refusals are checked
against a real worker and the real waiting code."""

import base64
import json
import logging
import time
from dataclasses import asdict
from typing import Any

import pytest
import redis
from celery import current_app
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from gateway_project.lib import task_mac
from gateway_project.lib.redis_clients import sync_redis
from registry import executor
from registry.call_consumer import TASK_REFUSED
from registry.executor import REPLY_REFUSED, CeleryExecutor, reply_key
from registry.models import Upstream
from registry.publish import task_envelope
from registry.tasks import list_tools_task, request_task
from registry.upstreams.requests import UpstreamRequest
from registry.worker import alive_key
from tests.conftest import needs
from tests.helpers import eventually, run

ALICE = {"person": "digest-of-alice", "kind": "token", "version": "3", "id": 7, "inbound": ""}
BOB_DIGEST = "digest-of-bob-7e1c0d"  # the forger's choice: it must never reach a log line
KWARGS = {"request": {"upstream_id": 1, "revision": 1, "method": "tools/call", "params": {}, "person": ALICE}}


@pytest.fixture
def redis_db() -> None:
    needs(bool(settings.REDIS_URL), "REDIS_URL is not set: nonces live in Redis")


# --- sign and verify ------------------------------------------------------------------------------------------


def test_a_sealed_task_passes_its_check_once_and_its_replay_is_refused(redis_db):
    seal = task_mac.task_seal("registry.request", KWARGS)
    task_mac.task_check("registry.request", KWARGS, seal)
    with pytest.raises(task_mac.Refused) as refused:
        task_mac.task_check("registry.request", KWARGS, seal)
    assert refused.value.reason == task_mac.REPLAYED == "its nonce was seen before (a replay)"


def test_a_kwarg_changed_after_signing_is_refused_whatever_field_it_is(redis_db):
    seal = task_mac.task_seal("registry.request", KWARGS)
    forged = json.loads(json.dumps(KWARGS))
    forged["request"]["person"]["person"] = BOB_DIGEST
    added = KWARGS | {"relay": {"events": "x"}}
    for kwargs in (forged, added, {}):
        with pytest.raises(task_mac.Refused) as refused:
            task_mac.task_check("registry.request", kwargs, seal)
        assert refused.value.reason == task_mac.WRONG == "its MAC does not verify"
    task_mac.task_check("registry.request", json.loads(json.dumps(KWARGS)), seal)  # as the worker reads them


def test_a_seal_is_bound_to_its_task_name_and_to_the_key(redis_db):
    seal = task_mac.task_seal("registry.request", KWARGS)
    with pytest.raises(task_mac.Refused, match="^its MAC does not verify$"):
        task_mac.task_check("registry.tunnel_call", KWARGS, seal)
    with (
        override_settings(GATEWAY_TASK_KEY="another-key-of-thirty-two-characters"),
        pytest.raises(task_mac.Refused, match="^its MAC does not verify$"),
    ):
        task_mac.task_check("registry.request", KWARGS, seal)


@pytest.mark.parametrize(
    ("seal", "reason"),
    [
        (None, "it carries no MAC"),
        ("a-string", "its MAC is malformed"),
        ({"nonce": "n", "exp": "9999999999", "mac": "0" * 64}, "its MAC is malformed"),
        ({"nonce": "n", "exp": True, "mac": "0" * 64}, "its MAC is malformed"),
        ({"nonce": "n", "exp": 9999999999}, "its MAC is malformed"),
        ({"nonce": "n", "exp": 9999999999, "mac": "0" * 64}, "its MAC does not verify"),
    ],
)
def test_a_missing_or_malformed_seal_is_refused(redis_db, seal, reason):
    with pytest.raises(task_mac.Refused) as refused:
        task_mac.task_check("registry.request", KWARGS, seal)
    assert refused.value.reason == reason


def test_kwargs_that_are_not_json_values_are_refused_as_malformed(redis_db):
    with pytest.raises(task_mac.Refused, match="^its MAC is malformed$"):
        task_mac.task_check("registry.request", {"when": object()}, {"nonce": "n", "exp": 1, "mac": "0" * 64})


def test_an_expired_seal_is_refused_and_one_within_the_clock_skew_is_not(redis_db):
    now = time.time()
    seal = task_mac.task_seal("registry.request", KWARGS, ttl=5, now=now)
    task_mac.task_check("registry.request", KWARGS, seal, now=seal["exp"] + task_mac.MAX_CLOCK_SKEW_SECONDS)
    late = task_mac.task_seal("registry.request", KWARGS, ttl=5, now=now)
    with pytest.raises(task_mac.Refused) as refused:
        task_mac.task_check("registry.request", KWARGS, late, now=late["exp"] + task_mac.MAX_CLOCK_SKEW_SECONDS + 1)
    assert refused.value.reason == task_mac.EXPIRED == "its MAC has expired"


def test_a_nonce_is_remembered_until_the_worker_would_call_its_seal_expired(redis_db):
    now = time.time()
    seal = task_mac.task_seal("registry.request", KWARGS, ttl=5, now=now)
    task_mac.task_check("registry.request", KWARGS, seal, now=now)
    remembered = sync_redis().ttl(f"{settings.GATEWAY_REDIS_PREFIX}task-nonce:{seal['nonce']}")
    assert seal["exp"] + task_mac.MAX_CLOCK_SKEW_SECONDS - now < remembered <= 5 + task_mac.MAX_CLOCK_SKEW_SECONDS + 2


def test_a_reply_opens_only_on_the_key_it_was_sealed_for_and_unaltered():
    outcome = {"ok": True, "result": {"content": [{"type": "text", "text": "é"}]}}
    wire = task_mac.reply_seal("sb:reply:one", outcome)
    assert task_mac.reply_open("sb:reply:one", wire.encode()) == outcome
    altered = wire.replace('"ok": true', '"ok": false')
    for key, forged, reason in [
        ("sb:reply:two", wire, "its MAC does not verify"),  # moved to another call
        ("sb:reply:one", altered, "its MAC does not verify"),
        ("sb:reply:one", json.dumps(outcome), "it carries no MAC"),  # what a worker pushed before MACs
        ("sb:reply:one", "", "it carries no MAC"),
    ]:
        with pytest.raises(task_mac.Refused) as refused:
            task_mac.reply_open(key, forged.encode())
        assert refused.value.reason == reason


def test_the_default_task_key_is_derived_from_the_secret_key_and_a_short_one_is_refused_unechoed(monkeypatch):
    from gateway_project.settings import keys as module

    monkeypatch.delenv("GATEWAY_TASK_KEY", raising=False)
    monkeypatch.setattr(module, "SECRET_KEY", "first-secret-key-of-some-length")
    one = module._task_key()
    monkeypatch.setattr(module, "SECRET_KEY", "second-secret-key-of-some-length")
    two = module._task_key()
    assert len(one) == len(two) == 64 and one != two
    assert "first-secret-key-of-some-length" not in one
    monkeypatch.setenv("GATEWAY_TASK_KEY", "k" * 32)
    assert module._task_key() == "k" * 32
    monkeypatch.setenv("GATEWAY_TASK_KEY", "short-secret-x")
    with pytest.raises(ImproperlyConfigured) as short:
        module._task_key()
    assert str(short.value) == "GATEWAY_TASK_KEY must be 32 characters or more"


def test_a_task_is_signed_whether_published_from_the_event_loop_or_by_apply_async(redis_db):
    """registry/publish.py signs what it pushes itself; `before_task_publish` signs what Celery publishes."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    kwargs = {"upstream_id": 1, "revision": 2, "reply_to": "sb:reply:x"}
    client.delete("publish-probe-mac")
    list_tools_task.apply_async(kwargs=kwargs, queue="publish-probe-mac", expires=5.0)
    theirs = json.loads(client.rpop("publish-probe-mac"))
    ours = json.loads(task_envelope(list_tools_task, kwargs=kwargs, queue="publish-probe-mac", expires=5.0))
    for message in (theirs, ours):
        task_mac.task_check("registry.list_tools", _kwargs_of(message), message["headers"][task_mac.HEADER])


# --- a real worker refuses what is not authentic --------------------------------------------------------------


def _time_call(world: Any, reply_to: str) -> dict[str, Any]:
    time_server = Upstream.objects.get(pk=world.upstreams["time"])
    call = UpstreamRequest.tool_call(
        time_server.id, time_server.revision, "get_current_time", {"timezone": "UTC"}, timeout=5.0, person=None
    )
    return {"request": asdict(call), "reply_to": reply_to, "call": ""}


def _kwargs_of(envelope: dict[str, Any]) -> dict[str, Any]:
    return json.loads(base64.b64decode(envelope["body"]))[1]


def _with_kwargs(envelope: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    args, _, embed = json.loads(base64.b64decode(envelope["body"]))
    return envelope | {"body": base64.b64encode(json.dumps([args, kwargs, embed]).encode()).decode()}


def _push(envelope: dict[str, Any], queue: str = "upstream") -> None:
    """What anyone who can write to the broker can do: put a message on a worker's queue."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).lpush(queue, json.dumps(envelope))


def _reply(key: str) -> dict[str, Any]:
    popped = sync_redis().blpop([key], timeout=10)
    assert popped, f"no reply on {key}"
    return task_mac.reply_open(key, popped[1])


def _forged_person(envelope: dict[str, Any]) -> dict[str, Any]:
    kwargs = _kwargs_of(envelope)
    kwargs["request"]["person"] = ALICE | {"person": BOB_DIGEST}
    return _with_kwargs(envelope, kwargs)


def _unsigned(envelope: dict[str, Any]) -> dict[str, Any]:
    headers = {k: v for k, v in envelope["headers"].items() if k != task_mac.HEADER}
    return envelope | {"headers": headers}


def _positional(envelope: dict[str, Any]) -> dict[str, Any]:
    _, kwargs, embed = json.loads(base64.b64decode(envelope["body"]))
    return envelope | {"body": base64.b64encode(json.dumps([[1], kwargs, embed]).encode()).decode()}


def _expired(envelope: dict[str, Any]) -> dict[str, Any]:
    old = task_mac.task_seal("registry.request", _kwargs_of(envelope), ttl=5, now=time.time() - 3600)
    return envelope | {"headers": envelope["headers"] | {task_mac.HEADER: old}}


def test_a_task_published_with_a_valid_mac_runs_on_the_worker(world, celery_worker):
    outcome = _wait_request(world)
    assert outcome["ok"], outcome
    demo = Upstream.objects.get(pk=world.upstreams["demo"])
    listed = CeleryExecutor().list_tools(upstream_id=demo.id, revision=demo.revision, timeout=5)
    assert listed["ok"], listed


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (_forged_person, "its MAC does not verify"),
        (_unsigned, "it carries no MAC"),
        (_expired, "its MAC has expired"),
        (_positional, "its MAC is malformed"),  # the MAC covers keyword arguments: the tasks take no others
    ],
)
def test_a_forged_unsigned_or_expired_task_is_refused_by_the_worker_and_its_caller_told(
    world, celery_worker, forge, reason
):
    key = reply_key()
    envelope = json.loads(task_envelope(request_task, kwargs=_time_call(world, key), queue="upstream", expires=5.0))
    _push(forge(envelope))
    outcome = _reply(key)
    assert (outcome["ok"], outcome["code"]) == (False, TASK_REFUSED)
    assert outcome["message"] == "The gateway's worker refused the call as not authentic: it did not run."
    assert outcome["detail"] == f"task registry.request refused: {reason}"
    line = f"task registry.request[{envelope['headers']['id']}] refused: {reason}"
    log = eventually(lambda: next((x for x in celery_worker.log.read_text().splitlines() if line in x), None))
    assert " WARNING registry.tasks " in log
    assert BOB_DIGEST not in celery_worker.log.read_text() and "get_current_time" not in log


def test_a_replayed_task_runs_once_and_the_replay_is_refused(world, celery_worker):
    key = reply_key()
    envelope = json.loads(task_envelope(request_task, kwargs=_time_call(world, key), queue="upstream", expires=5.0))
    _push(envelope)
    _push(envelope)  # the same message again, as someone who copied it off the queue would
    outcomes = [_reply(key), _reply(key)]
    refused = [o for o in outcomes if not o["ok"]]
    assert len(refused) == 1 and any(o["ok"] for o in outcomes), outcomes
    assert (refused[0]["code"], refused[0]["detail"]) == (
        TASK_REFUSED,
        "task registry.request refused: its nonce was seen before (a replay)",
    )
    line = f"task registry.request[{envelope['headers']['id']}] refused: its nonce was seen before (a replay)"
    eventually(lambda: line in celery_worker.log.read_text())


def test_a_refused_task_replies_only_to_a_reply_list(world, celery_worker):
    """A forged task's reply_to may name any key (a queue, say): the worker does not push there."""
    target = "not-a-reply-list"
    sync_redis().delete(target)
    envelope = json.loads(
        task_envelope(
            list_tools_task, kwargs={"upstream_id": 1, "revision": 1, "reply_to": target}, queue="upstream", expires=5
        )
    )
    _push(_unsigned(envelope))
    eventually(
        lambda: f"task registry.list_tools[{envelope['headers']['id']}] refused" in celery_worker.log.read_text()
    )
    assert sync_redis().llen(target) == 0


def test_a_task_sent_through_celerys_own_api_is_signed_and_runs(celery_worker):
    """handoff's tunnel sweep closes a tunnel with `send_task` (handoff/protocol/tunnels.py)."""
    sent = current_app.send_task("registry.tunnel_close", kwargs={"tunnel_id": "no-such-tunnel"}, queue="upstream")
    eventually(lambda: f"Task registry.tunnel_close[{sent.id}] succeeded" in celery_worker.log.read_text())
    assert f"registry.tunnel_close[{sent.id}] refused" not in celery_worker.log.read_text()


# --- the waiting side refuses a forged reply ------------------------------------------------------------------


def _wait_list_tools(world: Any) -> dict[str, Any]:
    demo = Upstream.objects.get(pk=world.upstreams["demo"])
    return CeleryExecutor().list_tools(upstream_id=demo.id, revision=demo.revision, timeout=5)


def _wait_request(world: Any) -> dict[str, Any]:
    call = UpstreamRequest(**_time_call(world, "")["request"])  # read before the loop runs: the ORM is sync
    return run(lambda: CeleryExecutor().request(call))


def _wait_tunnel_call(world: Any) -> dict[str, Any]:
    queue = "tunnel-forgery"  # no worker listens: only the attacker answers
    sync_redis().set(alive_key(queue), 1, ex=30)
    try:
        waiting = CeleryExecutor().tunnel_call(tunnel_id="t", queue=queue, tool="x", arguments={}, timeout=5)
        return run(lambda: waiting)
    finally:
        redis.Redis.from_url(settings.CELERY_BROKER_URL).delete(queue)
        sync_redis().delete(alive_key(queue))


@pytest.mark.parametrize(
    ("wait", "task"),
    [
        (_wait_list_tools, "registry.list_tools"),
        (_wait_request, "registry.request"),
        (_wait_tunnel_call, "registry.tunnel_call"),
    ],
)
@pytest.mark.parametrize(
    ("forged", "reason"),
    [
        (lambda key: json.dumps({"ok": True, "result": {"tools": []}}), "it carries no MAC"),
        # A genuine reply, copied from another call's list.
        (lambda key: task_mac.reply_seal(reply_key(), {"ok": True, "result": {}}), "its MAC does not verify"),
    ],
)
def test_a_forged_reply_is_refused_by_the_waiting_side(
    world, celery_worker, monkeypatch, caplog, wait, task, forged, reason
):
    key = reply_key()
    monkeypatch.setattr(executor, "reply_key", lambda: key)  # so that the attacker's reply is there first
    sync_redis().rpush(key, forged(key))
    with caplog.at_level(logging.WARNING, logger="registry.executor"):
        outcome = wait(world)
    assert (outcome["ok"], outcome["code"]) == (False, REPLY_REFUSED)
    assert outcome["message"] == (
        "The gateway could not trust its worker's answer: the call may or may not have run. "
        "Check its effect before repeating it."
    )
    assert outcome["detail"] == f"reply to {task} refused: {reason}"
    assert [r.getMessage() for r in caplog.records] == [f"reply to task {task} refused: {reason}"]
    sync_redis().delete(key)
