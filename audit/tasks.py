"""Periodic upkeep of the audit trail: Celery beat runs these; the embedded default, which has no beat, runs
the same on a timer in the web process (`embedded_audit_keeper`)."""

import asyncio
import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings

from audit.integrity import checkpoint_create
from audit.outcomes import outcomes_settle
from audit.retention import audit_prune
from gateway_project.lib.database import database_async
from gateway_project.lib.process_task import ProcessTask

logger = logging.getLogger(__name__)


@shared_task(name="audit.checkpoint", ignore_result=True, soft_time_limit=600)
def audit_checkpoint() -> int:
    """Seal everything settled since the last checkpoint (several checkpoints when far behind)."""
    made = 0
    while checkpoint_create() is not None:
        made += 1
    return made


@shared_task(name="audit.settle_outcomes", ignore_result=True, soft_time_limit=300)
def audit_settle_outcomes() -> int:
    """Approvals past their deadline with no completion get an outcome-unknown one (audit/outcomes.py)."""
    return outcomes_settle()


@shared_task(name="audit.prune", ignore_result=True, soft_time_limit=3000)
def audit_retention() -> int:
    if settings.GATEWAY_AUDIT_RETENTION_DAYS <= 0:
        return 0
    result = audit_prune(older_than=timedelta(days=settings.GATEWAY_AUDIT_RETENTION_DAYS))
    return result.deleted if result else 0


async def _keep(ready: asyncio.Future) -> None:
    ready.set_result(None)
    rounds = 0
    while True:
        await asyncio.sleep(settings.GATEWAY_AUDIT_CHECKPOINT_SECONDS)
        rounds += 1
        try:
            await database_async(audit_settle_outcomes)()
            await database_async(audit_checkpoint)()
            if rounds % 60 == 0:
                await database_async(audit_retention)()
        except Exception:  # a database hiccup: the next round does what this one could not
            logger.exception("audit upkeep failed")


embedded_audit_keeper = ProcessTask(_keep)
