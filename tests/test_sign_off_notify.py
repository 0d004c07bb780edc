"""The sign-off notification: each new sign-off request is told to one URL as a Standard Webhooks message, signed,
with the console link and never the arguments, off the call's path (a receiver that is slow or failing never holds
the agent's answer), retried on failure, and only to an address the egress guard lets the gateway reach."""

import base64
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import anyio
import pytest
import redis
from django.contrib.auth.models import Group
from prometheus_client import REGISTRY
from standardwebhooks import Webhook

from audit.models import DEFAULT_TEAM
from policy.models import Rule, SignOff
from policy.sign_off import sign_off_settle
from registry.models import Upstream
from registry.sign_off_notify import sign_off_notify_attempt
from tests import servers
from tests.clients import call
from tests.conftest import needs
from tests.factories import agent
from tests.helpers import eventually, run
from tests.test_settings import start
from tests.test_sign_off import asking, pending_call

SECRET = "whsec_" + base64.b64encode(b"a key for sign-off notifications!").decode()
PUBLIC = "https://switchboard.example.test"
HANG = 0  # in a receiver's script: hold the request until released

MODERN = "2026-07-28"  # told at once: a 2025-11-25 call would wait for the decision


class Receiver:
    """A webhook endpoint: it answers each POST with the next status of its script (200 once the script is done);
    HANG holds that request until `release` is set."""

    def __init__(self) -> None:
        self.url = ""
        self.script: list[int] = []
        self.messages: list[tuple[dict[str, str], bytes]] = []
        self.release = threading.Event()
        self.answered_hung = threading.Event()
        self._arrived = threading.Condition()

    def take(self, headers: dict[str, str], body: bytes) -> int:
        with self._arrived:
            self.messages.append((headers, body))
            self._arrived.notify_all()
            return self.script.pop(0) if self.script else 200

    def wait_for(self, count: int) -> list[tuple[dict[str, str], bytes]]:
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.messages) >= count, timeout=10), self.messages
            return list(self.messages)

    def reset(self, *script: int) -> None:
        with self._arrived:
            self.messages.clear()
            self.script = list(script)
        self.release.clear()
        self.answered_hung.clear()


@contextmanager
def webhook_receiver(host: str = "127.0.0.1") -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = receiver.take({k.lower(): v for k, v in self.headers.items()}, body)
            if status == HANG:
                receiver.release.wait(timeout=30)
                receiver.answered_hung.set()
                status = 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    receiver.url = f"http://{host}:{server.server_port}/hooks/sign-off?token=path-secret"  # logs name neither
    try:
        yield receiver
    finally:
        receiver.release.set()
        server.shutdown()
        server.server_close()


def notifying(receiver: Receiver) -> dict[str, str]:
    return {
        "GATEWAY_SIGN_OFF_WEBHOOK_URL": receiver.url,
        "GATEWAY_SIGN_OFF_WEBHOOK_SECRET": SECRET,
        "GATEWAY_PUBLIC_URL": PUBLIC,
        # Far beyond the bound on the agent's call below: a call that waited for the receiver would fail it.
        "GATEWAY_SIGN_OFF_WEBHOOK_TIMEOUT": "30",
    }


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with webhook_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def notifying_gateway(server_env, world, logs, receiver) -> Iterator[servers.Running]:
    log = logs / "gateway-sign-off-notify.log"
    with servers.inline_gateway_with(server_env, log, **notifying(receiver)) as running:
        yield running


@pytest.fixture(scope="module")
def dana(world) -> Iterator[tuple[Any, str]]:
    """An agent whose calls of demo's `add` need a sign-off by the console group `notify-approvers`."""
    group = Group.objects.create(name="notify-approvers")
    with agent("notify-dana") as (made, key):
        rule = Rule.objects.create(
            effect="sign_off", agent=made, upstream=Upstream.objects.get(slug="demo"), tool_pattern="add",
            signers=group,
        )  # fmt: skip
        yield made, key
        rule.delete()
    group.delete()


@pytest.fixture
def hook(receiver) -> Iterator[Receiver]:
    receiver.reset()
    yield receiver
    receiver.release.set()


def verified(message: tuple[dict[str, str], bytes]) -> dict[str, Any]:
    headers, body = message
    return Webhook(SECRET).verify(body, headers)


def test_a_new_request_is_told_once_signed_with_its_console_link_and_never_its_arguments(notifying_gateway, dana, hook):
    made, key = dana
    ident = pending_call(notifying_gateway, key, {"a": 40, "b": 2}).data["signOffId"]
    [message] = hook.wait_for(1)
    asked = SignOff.objects.select_related("team").get(pk=ident)
    assert verified(message) == {
        "type": "sign_off.asked",
        "timestamp": asked.asked_at.isoformat(),
        "data": {
            "id": ident,
            "team": DEFAULT_TEAM,
            "agent": "notify-dana",
            "person": "",
            "tool": "demo__add",
            "rule": asked.rule_id,
            "signers": "notify-approvers",
            "four_eyes": False,
            "asked_at": asked.asked_at.isoformat(),
            "wait_until": asked.wait_until.isoformat(),
            "console_url": f"{PUBLIC}/admin/sign-offs/#{ident}",
        },
    }
    assert message[0]["webhook-id"] == f"sign_off_{ident}" and message[0]["content-type"] == "application/json"
    joined = run(lambda: call(notifying_gateway.url, key, "demo__add", {"b": 2, "a": 40}, mode=MODERN))
    assert joined.data["signOffId"] == ident  # the same call: it joins the request, and nobody is told again
    other = run(lambda: call(notifying_gateway.url, key, "demo__add", {"a": 40, "b": 3}, mode=MODERN)).data["signOffId"]
    first, second = hook.wait_for(2)
    assert (first, verified(second)["data"]["id"]) == (message, other)
    assert len(hook.messages) == 2


def test_a_receiver_that_fails_is_tried_again_with_the_same_message(notifying_gateway, dana, hook):
    made, key = dana
    hook.reset(500)
    ident = pending_call(notifying_gateway, key, {"a": 50, "b": 1}).data["signOffId"]
    failed, taken = hook.wait_for(2)
    assert verified(failed) == verified(taken) and verified(taken)["data"]["id"] == ident
    assert failed[0]["webhook-id"] == taken[0]["webhook-id"] == f"sign_off_{ident}"
    port = urlsplit(hook.url).port
    said = f"sign-off notification {ident} to 127.0.0.1:{port}: it answered 500; retried in 1 s"
    eventually(lambda: said in notifying_gateway.log.read_text())


def test_a_receiver_that_never_answers_does_not_hold_the_agents_answer(notifying_gateway, dana, hook):
    made, key = dana
    hook.reset(HANG)

    async def bounded() -> Any:
        with anyio.fail_after(10):  # the gateway would wait 30 s for the receiver
            return await call(notifying_gateway.url, key, "demo__add", {"a": 60, "b": 1}, mode=MODERN)

    answer = run(bounded)
    assert answer.data["code"] == "SIGNOFF_PENDING"
    assert not hook.answered_hung.is_set()  # the receiver was never let answer: the agent did not wait for it
    [held] = hook.wait_for(1)
    assert verified(held)["data"]["id"] == answer.data["signOffId"]
    hook.release.set()
    assert hook.answered_hung.wait(timeout=5)


def refusals() -> float:
    return REGISTRY.get_sample_value("switchboard_sign_off_notifications_total", {"outcome": "refused"}) or 0.0


def test_an_address_the_egress_guard_refuses_is_not_contacted(db, settings, caplog):
    """127.0.0.2 is loopback, and the tests' gateways may reach 127.0.0.1 only (GATEWAY_EGRESS_ALLOWED_NETWORKS)."""
    with webhook_receiver("127.0.0.2") as inside, agent("notify-erin") as (erin, _key):
        pending = sign_off_settle(asking(erin.id, {"a": 1})).sign_off
        settings.GATEWAY_SIGN_OFF_WEBHOOK_URL = inside.url
        settings.GATEWAY_SIGN_OFF_WEBHOOK_SECRET = SECRET
        settings.GATEWAY_PUBLIC_URL = PUBLIC
        refused = refusals()
        with caplog.at_level(logging.INFO, logger="registry.sign_off_notify"):
            assert run(lambda: sign_off_notify_attempt(sign_off_id=str(pending.id), attempt=0)) is None
        assert inside.messages == []
        port = urlsplit(inside.url).port
        assert [r.getMessage() for r in caplog.records if r.name == "registry.sign_off_notify"] == [
            f"sign-off notification {pending.id} to 127.0.0.2:{port} not sent: the egress guard refused it: "
            "127.0.0.2 is not a public address"
        ]
        assert refusals() == refused + 1
        assert SECRET.removeprefix("whsec_") not in caplog.text and "path-secret" not in caplog.text


def test_a_request_decided_before_its_notification_is_not_told(db, settings):
    with webhook_receiver() as receiver, agent("notify-fay") as (fay, _key):
        pending = sign_off_settle(asking(fay.id, {"a": 2})).sign_off
        SignOff.objects.filter(pk=pending.pk).update(state=SignOff.State.EXPIRED, arguments=None)
        settings.GATEWAY_SIGN_OFF_WEBHOOK_URL = receiver.url
        settings.GATEWAY_SIGN_OFF_WEBHOOK_SECRET = SECRET
        assert run(lambda: sign_off_notify_attempt(sign_off_id=str(pending.id), attempt=0)) is None
        assert receiver.messages == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"GATEWAY_SIGN_OFF_WEBHOOK_URL": "https://hooks.example.test/x"},
            "GATEWAY_SIGN_OFF_WEBHOOK_SECRET must be `whsec_` and the base64 of 24 to 64 random bytes "
            "(GATEWAY_SIGN_OFF_WEBHOOK_URL is set)",
        ),
        (
            {
                "GATEWAY_SIGN_OFF_WEBHOOK_URL": "https://hooks.example.test/x",
                "GATEWAY_SIGN_OFF_WEBHOOK_SECRET": "whsec_c2hvcnQ=",
            },
            "GATEWAY_SIGN_OFF_WEBHOOK_SECRET must be `whsec_` and the base64 of 24 to 64 random bytes "
            "(GATEWAY_SIGN_OFF_WEBHOOK_URL is set)",
        ),
        (
            {"GATEWAY_SIGN_OFF_WEBHOOK_URL": "https://hooks.example.test/x", "GATEWAY_SIGN_OFF_WEBHOOK_SECRET": SECRET},
            "GATEWAY_SIGN_OFF_WEBHOOK_URL needs GATEWAY_PUBLIC_URL: each notification links to the console there",
        ),
        (
            {"GATEWAY_SIGN_OFF_WEBHOOK_URL": "hooks.example.test", "GATEWAY_SIGN_OFF_WEBHOOK_SECRET": SECRET},
            "GATEWAY_SIGN_OFF_WEBHOOK_URL must be an http:// or https:// URL",
        ),
    ],
)
def test_a_notification_that_could_not_be_sent_stops_the_process_never_naming_the_secret(tmp_path, env, message):
    started = start(tmp_path, **env)
    assert started.returncode == 1
    assert started.stderr.strip().splitlines()[-1] == f"django.core.exceptions.ImproperlyConfigured: {message}"
    assert "c2hvcnQ" not in started.stderr and SECRET.removeprefix("whsec_") not in started.stderr


def test_with_celery_a_worker_sends_it_and_retries_it(server_env, world, dana, receiver, logs):
    """A worker and a gateway of their own, on a broker of their own: the shared worker has no notification URL."""
    needs(bool(os.environ.get("REDIS_URL")), "REDIS_URL is not set: no Redis, so no Celery executor")
    made, key = dana
    broker = urlsplit(os.environ["REDIS_URL"])._replace(path="/14").geturl()
    env = server_env | notifying(receiver) | {"GATEWAY_EXECUTOR": "celery", "CELERY_BROKER_URL": broker}
    worker = servers.start_worker(env, logs / "worker-sign-off-notify.log")
    gateway = servers.start_gateway(servers.web_env(env, "celery"), logs / "gateway-celery-sign-off-notify.log")
    try:
        receiver.reset(503)
        ident = pending_call(gateway, key, {"a": 70, "b": 1}).data["signOffId"]
        failed, taken = receiver.wait_for(2)
        assert verified(failed) == verified(taken)
        assert verified(taken)["data"]["console_url"] == f"{PUBLIC}/admin/sign-offs/#{ident}"
        said = "it answered 503; retried in 1 s"
        eventually(lambda: said in worker.log.read_text())
    finally:
        gateway.stop()
        worker.stop()
        redis.Redis.from_url(broker).flushdb()
