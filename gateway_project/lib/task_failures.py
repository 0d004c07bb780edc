"""A task's failure, logged when it ends: asyncio says nothing of a task's exception until the task is awaited,
and the tasks a session or a request starts beside it often never are."""

import asyncio
import logging
from collections.abc import Callable


def failure_logger(logger: logging.Logger, what: str) -> Callable[[asyncio.Task], None]:
    """A done-callback that logs the task's exception, if it raised one, as `what` failing."""

    def logged(task: asyncio.Task) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("%s %s failed", what, task.get_name(), exc_info=exc)

    return logged
