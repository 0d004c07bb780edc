"""The sign-off notification (docs/policy.md, "Notification"): each new sign-off request is told to
GATEWAY_SIGN_OFF_WEBHOOK_URL as a Standard Webhooks message (`standardwebhooks` signs it), off the call's path.

Here, in registry, because the message leaves through the egress guard (registry/upstreams/egress.py), which policy
may not import; policy tells of new requests through a listener (policy/sign_off_listeners.py) that registry/apps.py
registers. With Celery, a task on queue `upstream` makes each attempt and publishes the next with a countdown (a fresh
message with a MAC of its own: registry/publish.py); in the embedded default, a coroutine on this process's upstream
loop (the serving loop in a web process) makes them, sleeping between. Either way the call that asked has its answer
without waiting for any of it.

The message carries what an approver needs to find the request and a console link to it, never the arguments
(shown only to approvers, in the console and the REST API); decisions are made there, not by answering this.
Every attempt of one request's message has the same `webhook-id`, so a receiver can drop a repeat."""

import asyncio
import json
import logging
import math
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx2
from celery import current_app
from django.conf import settings
from django.utils import timezone
from standardwebhooks import Webhook

from audit.telemetry import SIGN_OFF_NOTIFICATIONS
from gateway_project.lib.database import database_async
from gateway_project.lib.task_mac import DEFAULT_TTL_SECONDS
from policy.models import SignOff
from registry.publish import task_headers
from registry.upstreams.egress import EgressRefused, guarded_client
from registry.upstreams.loop import pool_thread

logger = logging.getLogger(__name__)

EVENT = "sign_off.asked"
TASK = "registry.notify_sign_off"
FIRST_RETRY_SECONDS = 1.0
LONGEST_RETRY_SECONDS = 60.0
RETRIED_STATUSES = frozenset({408, 429})  # and every 5xx
_sending: set[Future] = set()  # held: the loop keeps only weak references to the tasks behind them


@dataclass(frozen=True)
class Notification:
    message_id: str
    body: str


class NotSent(Exception):
    """A failure that no retry mends: the egress guard's refusal (`outcome` refused), or an answer such as 404."""

    def __init__(self, outcome: str, why: str) -> None:
        super().__init__(why)
        self.outcome = outcome


def console_link(sign_off_id: str) -> str:
    return f"{settings.GATEWAY_PUBLIC_URL.rstrip('/')}/admin/sign-offs/#{sign_off_id}"


def notification_build(*, sign_off_id: str) -> Notification | None:
    """The message for a request still waiting for a decision (None once decided or expired: nobody need look)."""
    found = (
        SignOff.objects.filter(pk=sign_off_id, state=SignOff.State.PENDING, wait_until__gt=timezone.now())
        .select_related("team", "agent", "signers")
        .first()
    )
    if found is None:
        return None
    data = {
        "id": str(found.id),
        "team": found.team.slug,
        "agent": found.agent.name,
        "person": found.person_name,
        "tool": found.exposed_name,
        "rule": found.rule_id,
        "signers": found.signers.name if found.signers else "",  # empty: the caller signs off themself
        "four_eyes": found.four_eyes,
        "asked_at": found.asked_at.isoformat(),
        "wait_until": found.wait_until.isoformat(),
        "console_url": console_link(str(found.id)),
    }
    body = {"type": EVENT, "timestamp": found.asked_at.isoformat(), "data": data}
    return Notification(message_id=f"sign_off_{found.id}", body=json.dumps(body, separators=(",", ":")))


def _where() -> str:
    """The receiver as logs name it: its host and port, never the path or query (which may hold a token)."""
    parts = urlsplit(settings.GATEWAY_SIGN_OFF_WEBHOOK_URL)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


async def notification_post(notification: Notification) -> str | None:
    """One attempt: None once the receiver took it (2xx), else why not, worth a retry; NotSent for the rest."""
    now = datetime.now(UTC)
    secret = Webhook(settings.GATEWAY_SIGN_OFF_WEBHOOK_SECRET)
    headers = {
        "content-type": "application/json",
        "webhook-id": notification.message_id,
        "webhook-timestamp": str(math.floor(now.timestamp())),
        "webhook-signature": secret.sign(notification.message_id, now, notification.body),
    }
    seconds = settings.GATEWAY_SIGN_OFF_WEBHOOK_TIMEOUT
    try:
        async with asyncio.timeout(seconds), guarded_client(internal=False, timeout=seconds) as http:
            answer = await http.post(
                settings.GATEWAY_SIGN_OFF_WEBHOOK_URL, content=notification.body.encode(), headers=headers
            )
    except EgressRefused as refused:
        raise NotSent("refused", f"the egress guard refused it: {refused}") from None
    except TimeoutError:
        return f"no answer within {seconds:g} s"
    except httpx2.HTTPError as exc:  # no connection, or it broke off
        return type(exc).__name__
    if answer.is_success:
        return None
    if answer.status_code in RETRIED_STATUSES or answer.status_code >= 500:
        return f"it answered {answer.status_code}"
    raise NotSent("failed", f"it answered {answer.status_code}")


def retry_delay(attempt: int) -> float:
    """Seconds before the attempt after `attempt` (0 the first): 1 s, then twice as long each time, at most 60."""
    return min(FIRST_RETRY_SECONDS * 2**attempt, LONGEST_RETRY_SECONDS)


async def sign_off_notify_attempt(*, sign_off_id: str, attempt: int) -> float | None:
    """Attempt `attempt` (0 the first) to deliver the request's message: seconds until the next, or None when
    there is none (delivered, no longer pending, or given up, each logged and counted)."""
    if not settings.GATEWAY_SIGN_OFF_WEBHOOK_URL:  # a worker not given the web process's settings
        logger.warning("sign-off notification %s not sent: GATEWAY_SIGN_OFF_WEBHOOK_URL is not set here", sign_off_id)
        return None
    notification = await database_async(notification_build)(sign_off_id=sign_off_id)
    if notification is None:
        return None
    try:
        failure = await notification_post(notification)
    except NotSent as exc:
        SIGN_OFF_NOTIFICATIONS.labels(exc.outcome).inc()
        logger.warning("sign-off notification %s to %s not sent: %s", sign_off_id, _where(), exc)
        return None
    if failure is None:
        SIGN_OFF_NOTIFICATIONS.labels("delivered").inc()
        return None
    if attempt < settings.GATEWAY_SIGN_OFF_WEBHOOK_RETRIES:
        delay = retry_delay(attempt)
        logger.info("sign-off notification %s to %s: %s; retried in %g s", sign_off_id, _where(), failure, delay)
        return delay
    SIGN_OFF_NOTIFICATIONS.labels("failed").inc()
    tries = attempt + 1
    logger.warning("sign-off notification %s to %s failed %d times, last: %s", sign_off_id, _where(), tries, failure)
    return None


async def sign_off_notify_deliver(*, sign_off_id: str) -> None:
    """Every attempt, with its waits between (the embedded default's way)."""
    attempt = 0
    while (delay := await sign_off_notify_attempt(sign_off_id=sign_off_id, attempt=attempt)) is not None:
        await asyncio.sleep(delay)
        attempt += 1


def _done(sent: Future) -> None:
    _sending.discard(sent)
    if not sent.cancelled() and (exc := sent.exception()) is not None:
        logger.error("sign-off notification failed", exc_info=exc)


def sign_off_notify_soon(sign_off_id: str) -> None:
    """The listener (policy/sign_off_listeners.py): hand the message to whoever sends it, without waiting."""
    if not settings.GATEWAY_SIGN_OFF_WEBHOOK_URL:
        return
    if settings.GATEWAY_EXECUTOR == "celery":
        sign_off_notify_publish(sign_off_id=sign_off_id, attempt=0)
        return
    sent = pool_thread().submit(sign_off_notify_deliver(sign_off_id=sign_off_id))
    _sending.add(sent)
    sent.add_done_callback(_done)


def sign_off_notify_publish(*, sign_off_id: str, attempt: int, countdown: float = 0.0) -> None:
    """Celery's way: attempt `attempt` as a task of its own, `countdown` seconds from now."""
    kwargs = {"sign_off_id": sign_off_id, "attempt": attempt}
    headers = task_headers(TASK, kwargs, countdown + DEFAULT_TTL_SECONDS)  # its MAC outlives the countdown
    current_app.send_task(TASK, kwargs=kwargs, queue="upstream", countdown=countdown, headers=headers)
