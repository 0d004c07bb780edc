"""MACs on the work a web process hands a Celery worker, and on the worker's reply, so that whoever can write
to Redis can neither run a call (as someone else, with their credential) nor forge its result.

A task's MAC (HMAC-SHA256 through Django's `salted_hmac`, under GATEWAY_TASK_KEY) covers the task's name, the
canonical JSON of its keyword arguments, a nonce and an expiry time; it travels in a message header, so the
kwargs stay as they are. The worker checks it, then claims the nonce in Redis (SET NX, kept past the expiry):
a message seen before is a replay. A reply's MAC covers the reply key it was pushed to and the exact bytes of
the outcome's JSON, so one reply cannot be moved to another call.
"""

import json
import math
import secrets
import time
from typing import Any

from django.conf import settings
from django.utils.crypto import constant_time_compare, salted_hmac

from gateway_project.lib.redis_clients import command, sync_redis
from gateway_project.lib.signing import canonical_json

HEADER = "switchboard_mac"  # the task message header that carries the seal
TASK_SALT = "switchboard.task_mac.task"
REPLY_SALT = "switchboard.task_mac.reply"  # another salt: a task's MAC is never a reply's
DEFAULT_TTL_SECONDS = 60.0  # for a message whose publisher names no expiry (the longest a task waits)
MAX_CLOCK_SKEW_SECONDS = 30  # between the publisher's clock and the worker's

# Why a message was refused: logged, and told to the caller, never with the kwargs' values.
MISSING = "it carries no MAC"
MALFORMED = "its MAC is malformed"
WRONG = "its MAC does not verify"
EXPIRED = "its MAC has expired"
REPLAYED = "its nonce was seen before (a replay)"


class Refused(Exception):
    """A task or a reply whose MAC did not pass, with the reason."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _task_mac(name: str, kwargs: dict[str, Any], nonce: str, expires: int) -> str:
    message = canonical_json({"task": name, "kwargs": kwargs, "nonce": nonce, "exp": expires})
    return salted_hmac(TASK_SALT, message, secret=settings.GATEWAY_TASK_KEY, algorithm="sha256").hexdigest()


def task_seal(
    name: str, kwargs: dict[str, Any], *, ttl: float = DEFAULT_TTL_SECONDS, now: float | None = None
) -> dict[str, Any]:
    """The header value (under HEADER) for the task `name` called with `kwargs` (JSON values), valid `ttl`
    seconds from `now`."""
    nonce = secrets.token_urlsafe(16)
    expires = math.ceil((time.time() if now is None else now) + ttl)
    return {"nonce": nonce, "exp": expires, "mac": _task_mac(name, kwargs, nonce, expires)}


def _nonce_key(nonce: str) -> str:
    return f"{settings.GATEWAY_REDIS_PREFIX}task-nonce:{nonce}"


def _verified(name: str, kwargs: dict[str, Any], seal: Any, now: float | None) -> tuple[str, int]:
    """The seal's nonce key and how long to remember it, or Refused: every check but the replay's."""
    if seal is None:
        raise Refused(MISSING)
    if not (
        isinstance(seal, dict)
        and isinstance(seal.get("nonce"), str)
        and type(seal.get("exp")) is int
        and isinstance(seal.get("mac"), str)
    ):
        raise Refused(MALFORMED)
    try:
        expected = _task_mac(name, kwargs, seal["nonce"], seal["exp"])
    except (TypeError, ValueError):  # kwargs that are not JSON values were never signed
        raise Refused(MALFORMED) from None
    if not constant_time_compare(expected, seal["mac"]):
        raise Refused(WRONG)
    clock = time.time() if now is None else now
    if seal["exp"] + MAX_CLOCK_SKEW_SECONDS < clock:
        raise Refused(EXPIRED)
    # Remembered until the worker itself would call the seal expired, so a replay is never accepted.
    return _nonce_key(seal["nonce"]), math.ceil(seal["exp"] + MAX_CLOCK_SKEW_SECONDS - clock) + 1


def task_check(name: str, kwargs: dict[str, Any], seal: Any, *, now: float | None = None) -> None:
    """Raise Refused unless `seal` is a valid, unexpired seal of this task and kwargs, seen for the first
    time. One HMAC and, for an authentic message only, one SET NX."""
    key, remember = _verified(name, kwargs, seal, now)
    if not sync_redis().set(key, 1, nx=True, ex=remember):
        raise Refused(REPLAYED)


async def task_check_async(name: str, kwargs: dict[str, Any], seal: Any) -> None:
    """task_check from an event loop (the worker's call consumer, registry/call_consumer.py)."""
    key, remember = _verified(name, kwargs, seal, None)
    if not await command("SET", key, 1, "NX", "EX", remember):
        raise Refused(REPLAYED)


def _reply_mac(key: str, body: bytes) -> str:
    # Length-prefixed, so no key and body pair reads as another; the body is fed in without a copy.
    mac = salted_hmac(REPLY_SALT, f"{len(key)}:{key}", secret=settings.GATEWAY_TASK_KEY, algorithm="sha256")
    mac.update(body)
    return mac.hexdigest()


def reply_seal(key: str, outcome: dict[str, Any]) -> str:
    """What to push onto the reply list `key`: the outcome's JSON, after its MAC and a space."""
    body = json.dumps(outcome)
    return f"{_reply_mac(key, body.encode())} {body}"


def reply_open(key: str, wire: bytes | str) -> dict[str, Any]:
    """The outcome in a reply popped from `key`, or Refused if its MAC is missing or wrong."""
    raw = wire.encode() if isinstance(wire, str) else wire
    mac, space, body = raw.partition(b" ")
    if not space or len(mac) != 64:
        raise Refused(MISSING)
    if not constant_time_compare(_reply_mac(key, body), mac):
        raise Refused(WRONG)
    return json.loads(body)
