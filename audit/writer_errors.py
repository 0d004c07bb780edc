"""What the async audit writers (audit/writer.py, audit/sqlite_writer.py) refuse with, and count."""

from dataclasses import dataclass


class AuditUnavailable(Exception):
    """The row could not be written. Callers fail closed: nothing runs, or nothing is shown, unrecorded."""


class AuditSettled(Exception):
    """The call already has its outcome row (the sweep's outcome-unknown, audit/outcomes.py): the first one
    written stands, and this one is not."""


@dataclass
class AuditCommits:
    """What the writer committed: transactions and the rows in them (rows / transactions is the grouping)."""

    transactions: int = 0
    rows: int = 0
