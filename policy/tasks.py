"""Periodic upkeep of sign-off requests: Celery beat runs the sweep; the embedded default, which has no beat,
runs it on a timer in the web process (`embedded_sign_off_keeper`)."""

import asyncio
import logging

from celery import shared_task
from django.conf import settings

from gateway_project.lib.database import database_async
from gateway_project.lib.process_task import ProcessTask
from policy.sign_off import sign_offs_expire

logger = logging.getLogger(__name__)


@shared_task(name="policy.expire_sign_offs", ignore_result=True, soft_time_limit=300)
def expire_sign_offs() -> int:
    """Requests no one decided within their wait, and grants no call used in time, expire (each with its row)."""
    return sign_offs_expire()


async def _keep(ready: asyncio.Future) -> None:
    ready.set_result(None)
    while True:
        await asyncio.sleep(settings.GATEWAY_SIGN_OFF_SWEEP_SECONDS)
        try:
            await database_async(expire_sign_offs)()
        except Exception:  # a database hiccup: the next round expires what this one could not
            logger.exception("sign-off sweep failed")


embedded_sign_off_keeper = ProcessTask(_keep)
