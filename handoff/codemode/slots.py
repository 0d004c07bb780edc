"""How many executions one process runs at once, in all and per agent. Without a bound agents could start
Deno processes until the machine's memory ran out, and one agent could hold every slot while others wait.
A slot is never waited for: a full process refuses at once, with a reason the model can act on."""

import threading
from collections import Counter

from registry.upstreams.outcome import Outcome, failure


class SandboxSlots:
    def __init__(self, total: int, per_agent: int) -> None:
        self.total, self.per_agent = total, per_agent
        self._running: Counter[int] = Counter()  # agent id -> executions it runs here
        self._lock = threading.Lock()  # a worker may take slots from more than one thread

    def take(self, agent_id: int) -> Outcome | None:
        """None when a slot is now the agent's (give it back), else the refusal."""
        with self._lock:
            if self._running[agent_id] >= self.per_agent:
                return failure(
                    "SANDBOX_AGENT_LIMIT",
                    f"This agent is running as many executions as it may at once here ({self.per_agent}); "
                    "retry when one has finished.",
                )
            if self._running.total() >= self.total:
                return failure(
                    "SANDBOX_BUSY",
                    f"No sandbox is free (at most {self.total} executions run at once here); retry in a few seconds.",
                )
            self._running[agent_id] += 1
            return None

    def give_back(self, agent_id: int) -> None:
        with self._lock:
            self._running[agent_id] -= 1
            if not self._running[agent_id]:
                del self._running[agent_id]
