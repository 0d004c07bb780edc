"""Publishing a Celery task from the event loop, for the one hot path that needs it (tools/call).

kombu's Redis client blocks, so `apply_async` from async code needs a thread hop; the two cost about a
millisecond a call. Here Celery itself builds the task message (`app.amqp.as_task_v2`: task protocol 2, what
the worker reads), it is wrapped in the envelope kombu's Redis transport gives every message, and pushed
with the async client onto the queue's list, where the worker's BRPOP takes it. Any other broker goes through
`apply_async` in a thread.

Every task message carries a MAC in a header (gateway_project/lib/task_mac.py), which the worker checks
(registry/tasks.py Checked): the ones published here, and any published through Celery's own API anywhere in a
process that imported this module (`before_task_publish` below).

An agent's call (`registry.request`) may skip Celery's message altogether (GATEWAY_CALL_TRANSPORT=direct):
`call_push` puts its keyword arguments and their seal, as JSON, on a list of its own that every worker's call
consumer takes from on its upstream pool's loop (registry/call_consumer.py).
"""

import asyncio
import base64
import json
import uuid
from typing import Any

from celery import Task, current_app
from celery.signals import before_task_publish
from celery.utils.nodenames import anon_nodename
from django.conf import settings
from kombu.serialization import dumps

from gateway_project.lib import task_mac
from gateway_project.lib.redis_clients import async_redis, command


def task_headers(name: str, kwargs: dict[str, Any], expires: float) -> dict[str, Any]:
    """The headers that sign a task message: its MAC, valid as long as the task itself."""
    return {task_mac.HEADER: task_mac.task_seal(name, kwargs, ttl=expires)}


@before_task_publish.connect(dispatch_uid="switchboard-task-mac")
def _sign(sender: str, body: Any, headers: dict[str, Any], **_: Any) -> None:
    """Celery publishes the message with these very headers: one sent with `send_task` or `apply_async`
    without a MAC (by handoff's tunnel sweep, say) gets one here."""
    if task_mac.HEADER not in headers and isinstance(body, tuple):  # task protocol 2: (args, kwargs, embed)
        headers.update(task_headers(sender, body[1], task_mac.DEFAULT_TTL_SECONDS))


def task_envelope(task: Task, *, kwargs: dict[str, Any], queue: str, expires: float) -> str:
    """The JSON kombu's Redis transport would push for `task.apply_async(kwargs=..., queue=..., expires=...)`."""
    task_id = str(uuid.uuid4())
    message = current_app.amqp.as_task_v2(
        task_id,
        task.name,
        args=(),
        kwargs=kwargs,
        expires=expires,
        time_limit=task.time_limit,
        soft_time_limit=task.soft_time_limit,
        ignore_result=task.ignore_result,
        origin=anon_nodename(),  # as apply_async names the sender, for the worker's log
    )
    headers = message.headers | task_headers(task.name, kwargs, expires)
    content_type, content_encoding, body = dumps(message.body, serializer="json")
    properties = message.properties | {
        "delivery_mode": 2,
        "expiration": str(int(expires * 1000)),
        "delivery_info": {"exchange": "", "routing_key": queue},
        "priority": 0,
        "body_encoding": "base64",
        "delivery_tag": str(uuid.uuid4()),
    }
    return json.dumps(
        {
            "body": base64.b64encode(body.encode()).decode(),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": properties,
        }
    )


async def task_publish(name: str, *, kwargs: dict[str, Any], queue: str, expires: float) -> None:
    """Publish the task named `name`. By name, as Celery's `send_task` does: the web process does not import
    the workers' task modules (Celery's autodiscovery registers them, with their time limits)."""
    task = current_app.tasks[name]
    if not settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        headers = task_headers(name, kwargs, expires)
        await asyncio.to_thread(task.apply_async, kwargs=kwargs, queue=queue, expires=expires, headers=headers)
        return
    envelope = task_envelope(task, kwargs=kwargs, queue=queue, expires=expires)
    await async_redis(settings.CELERY_BROKER_URL).lpush(queue, envelope)


CALL_TASK = "registry.request"  # the task a pushed call stands for: its seal names it, as the task's would


def calls_key() -> str:
    """The broker's list of calls pushed for the workers' call consumers."""
    return f"{settings.GATEWAY_REDIS_PREFIX}upstream-calls"


def call_envelope(kwargs: dict[str, Any], *, expires: float) -> str:
    return json.dumps({"kwargs": kwargs, "seal": task_mac.task_seal(CALL_TASK, kwargs, ttl=expires)})


async def call_push(kwargs: dict[str, Any], *, expires: float) -> None:
    """Hand an agent's call (`registry.request`'s keyword arguments) to the first free call consumer; one that
    no worker takes before its seal's expiry is dropped, not run late."""
    await command("LPUSH", calls_key(), call_envelope(kwargs, expires=expires), url=settings.CELERY_BROKER_URL)
