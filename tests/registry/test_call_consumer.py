"""A worker's own call consumer (registry/call_consumer.py): agents' calls pushed straight onto the broker's list
(GATEWAY_CALL_TRANSPORT=direct) run on a real worker's pool, past Celery's consumer, with the task's guarantees:
only a sealed call runs, once; a refused one says so to its caller; a malformed one is dropped, and the
consumer goes on taking calls."""

import json
import logging
import time
from dataclasses import asdict
from typing import Any

import pytest
import redis
from celery import current_app
from django.conf import settings
from django.test import override_settings

from gateway_project.lib import task_mac
from gateway_project.lib.redis_clients import sync_redis
from registry.call_consumer import TASK_REFUSED, CallConsumerStep
from registry.executor import CeleryExecutor, reply_key
from registry.models import Upstream
from registry.publish import CALL_TASK, call_envelope, calls_key
from registry.upstreams.requests import UpstreamRequest
from tests.helpers import eventually, run

pytestmark = pytest.mark.e2e


def _echo(world: Any, text: str = "direct") -> UpstreamRequest:
    demo = Upstream.objects.get(pk=world.upstreams["demo"])
    return UpstreamRequest.tool_call(demo.id, demo.revision, "echo", {"text": text}, timeout=5.0)


def _kwargs(world: Any, reply_to: str) -> dict[str, Any]:
    return {"request": asdict(_echo(world)), "reply_to": reply_to, "call": ""}


def _push(raw: str | bytes) -> None:
    """What anyone who can write to the broker can do: put an envelope on the workers' list."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).lpush(calls_key(), raw)


def _reply(key: str) -> dict[str, Any]:
    popped = sync_redis().blpop([key], timeout=10)
    assert popped, f"no reply on {key}"
    return task_mac.reply_open(key, popped[1])


def _logged(worker: Any, line: str) -> str:
    return eventually(lambda: next((x for x in worker.log.read_text().splitlines() if line in x), None))


@override_settings(GATEWAY_CALL_TRANSPORT="direct")
def test_a_call_pushed_past_celery_runs_on_the_workers_pool_and_is_answered(world, celery_worker):
    call = _echo(world, "straight to the pool")
    received = celery_worker.log.read_text().count("Task registry.request[")
    outcome = run(lambda: CeleryExecutor().request(call))
    assert outcome["ok"], outcome
    assert outcome["result"]["content"][0]["text"] == "straight to the pool"
    assert celery_worker.log.read_text().count("Task registry.request[") == received  # no Celery task ran it


def _forged(envelope: dict[str, Any]) -> dict[str, Any]:
    kwargs = json.loads(json.dumps(envelope["kwargs"]))
    kwargs["request"]["arguments"] = {"text": "forged"}
    return envelope | {"kwargs": kwargs}


def _unsigned(envelope: dict[str, Any]) -> dict[str, Any]:
    return envelope | {"seal": None}


def _expired(envelope: dict[str, Any]) -> dict[str, Any]:
    return envelope | {"seal": task_mac.task_seal(CALL_TASK, envelope["kwargs"], ttl=5, now=time.time() - 3600)}


def _bad_seal(envelope: dict[str, Any]) -> dict[str, Any]:
    return envelope | {"seal": {"nonce": "n", "exp": "soon", "mac": "x"}}


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (_forged, "its MAC does not verify"),
        (_unsigned, "it carries no MAC"),
        (_expired, "its MAC has expired"),
        (_bad_seal, "its MAC is malformed"),
    ],
)
def test_a_forged_unsigned_or_expired_call_is_refused_and_its_caller_told(world, celery_worker, forge, reason):
    key = reply_key()
    _push(json.dumps(forge(json.loads(call_envelope(_kwargs(world, key), expires=5.0)))))
    outcome = _reply(key)
    assert (outcome["ok"], outcome["code"]) == (False, TASK_REFUSED)
    assert outcome["message"] == "The gateway's worker refused the call as not authentic: it did not run."
    assert outcome["detail"] == f"task registry.request refused: {reason}"
    assert " WARNING registry.call_consumer " in _logged(celery_worker, f"call registry.request refused: {reason}")


def test_a_replayed_call_runs_once_and_the_replay_is_refused(world, celery_worker):
    key = reply_key()
    envelope = call_envelope(_kwargs(world, key), expires=5.0)
    _push(envelope)
    _push(envelope)  # copied off the list by whoever can read it
    outcomes = [_reply(key), _reply(key)]
    refused = [o for o in outcomes if not o["ok"]]
    assert len(refused) == 1 and any(o["ok"] for o in outcomes), outcomes
    assert refused[0]["detail"] == "task registry.request refused: its nonce was seen before (a replay)"


@pytest.mark.parametrize("raw", [b"\xff not json", b"[1, 2]", b'{"kwargs": []}', b'{"seal": {}}'])
def test_a_malformed_envelope_is_dropped_and_the_consumer_takes_the_next_call(world, celery_worker, raw):
    before = celery_worker.log.read_text().count("call registry.request refused: its envelope is malformed")
    _push(raw)
    eventually(
        lambda: celery_worker.log.read_text().count("call registry.request refused: its envelope is malformed") > before
    )
    key = reply_key()
    _push(call_envelope(_kwargs(world, key), expires=5.0))
    assert _reply(key)["ok"]


def test_a_sealed_call_of_another_shape_is_refused_as_malformed(world, celery_worker):
    """Sealed, so a web process's own: one of another version, whose fields this worker does not know."""
    key = reply_key()
    kwargs = _kwargs(world, key)
    kwargs["request"] |= {"unknown_field": 1}
    _push(call_envelope(kwargs, expires=5.0))
    outcome = _reply(key)
    assert (outcome["code"], outcome["detail"]) == (
        TASK_REFUSED,
        "task registry.request refused: its envelope is malformed",
    )


def test_a_refused_call_replies_only_to_a_reply_list(world, celery_worker):
    target = "not-a-reply-list"
    sync_redis().delete(target)
    envelope = json.loads(call_envelope(_kwargs(world, target), expires=5.0))
    before = celery_worker.log.read_text().count("call registry.request refused: it carries no MAC")
    _push(json.dumps(_unsigned(envelope)))
    eventually(lambda: celery_worker.log.read_text().count("call registry.request refused: it carries no MAC") > before)
    assert sync_redis().llen(target) == 0


def test_a_call_no_worker_took_before_its_expiry_is_dropped_not_run(world, celery_worker):
    """As Celery drops a task past its `expires`: its caller has given up (the seal, within the clock skew
    allowed, still verifies)."""
    key = reply_key()
    kwargs = _kwargs(world, key)
    late = task_mac.task_seal(CALL_TASK, kwargs, ttl=1, now=time.time() - 10)
    _push(json.dumps({"kwargs": kwargs, "seal": late}))
    _logged(celery_worker, "call registry.request dropped: no worker took it before it expired")
    assert sync_redis().llen(key) == 0


def test_a_worker_that_does_not_consume_the_upstream_queue_takes_no_pushed_calls():
    """A worker for code mode alone (`-Q sandbox`) runs no agents' calls, pushed or sent as tasks."""
    worker = current_app.WorkController(
        queues=["sandbox"], pool_cls="solo", concurrency=1, without_mingle=True, without_gossip=True
    )
    try:
        step = next(s for s in worker.blueprint.steps.values() if isinstance(s, CallConsumerStep))
        step.start(worker)
        assert step.consumer is None
    finally:
        current_app.amqp.queues.select(["upstream", "sandbox"])  # the app's selection is this process's


def test_a_consumer_that_cannot_serve_says_why_and_the_workers_shutdown_goes_on(caplog):
    """Pushed calls would go unanswered: the worker's log says so at once, and its warm shutdown still ends."""
    worker = current_app.WorkController(
        queues=["upstream"], pool_cls="solo", concurrency=1, without_mingle=True, without_gossip=True
    )
    try:
        step = next(s for s in worker.blueprint.steps.values() if isinstance(s, CallConsumerStep))
        # Celery's worker set-up took the root logger's handlers, the test's capture among them.
        logging.getLogger("registry.call_consumer").addHandler(caplog.handler)
        with override_settings(CELERY_BROKER_URL="amqp://127.0.0.1:1//"):
            step.start(worker)
            stopped = eventually(
                lambda: [r for r in caplog.records if r.getMessage().startswith("call consumer stopped")]
            )
        assert stopped[0].levelname == "ERROR"
        assert "Redis URL must specify one of the following schemes" in stopped[0].getMessage()
        step.stop(worker)
        assert step.consumer is None
    finally:
        logging.getLogger("registry.call_consumer").removeHandler(caplog.handler)
        current_app.amqp.queues.select(["upstream", "sandbox"])
