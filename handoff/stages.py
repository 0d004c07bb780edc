"""Stages of your own in every call to an upstream's tool. Put a `stages.py` module in any installed Django app
(GATEWAY_EXTRA_APPS adds yours) and register functions (plain or async) at either of two points:

    from handoff.stages import StageCall, StageRefusal, after_execute, before_execute

    @before_execute(name="no_deletes")
    def no_deletes(call: StageCall) -> None:
        if call.tool.startswith("delete_"):
            raise StageRefusal("NO_DELETES", "Deleting is not allowed through this gateway: ask a person.")

    @after_execute(name="signed")
    def signed(call: StageCall, result: dict) -> dict:
        return result | {"_meta": {"example.com/checked": True}}

A before-execute stage sees the arguments the upstream will receive, after the call is decided and admitted and
before its approval row; a refusal ends the call with a denied row naming the stage, and the agent gets its code
and message as a JSON-RPC error. An after-execute stage sees the result (as the model would read it) and returns
it, changed or not, before the completion row is written and the model reads it; a result that is no longer a
tool result is withheld. Stages run in the order their apps are installed, the built-in result filter
(handoff/result_filter.py) first. A stage that raises anything else ends the call with the gateway's own error.
"""

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

BEFORE, AFTER = "before_execute", "after_execute"


@dataclass(frozen=True)
class StageCall:
    """What a stage sees of the call: who, which tool, and the arguments (read-only)."""

    request_id: str
    name: str  # the exposed name the agent called
    upstream: str
    tool: str  # the upstream's own name for it
    arguments: Mapping[str, Any]
    agent_name: str
    person_subject: str  # "" for an API key that names nobody
    # What the stage wants the call's row to say (a count, never a secret): kept under the stage's name.
    audit: dict[str, Any] = field(default_factory=dict)


class StageRefusal(Exception):
    """A before-execute stage refusing the call: `code` is stable (UPPER_SNAKE), `message` is for the model."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class Stage:
    name: str
    point: str  # BEFORE or AFTER
    run: Callable[..., Any]
    # The gateway's own stage gives back the very result it was given when it changes nothing: that needs no new
    # check, while an operator's stage may have changed it in place.
    own: bool = False

    async def __call__(self, *args: Any) -> Any:
        value = self.run(*args)
        return await value if inspect.isawaitable(value) else value


# Each point's chain, in order of registration: made as stages register (at start-up), read by every call.
_chains: dict[str, tuple[Stage, ...]] = {BEFORE: (), AFTER: ()}


def _register(point: str, name: str, own: bool = False) -> Callable:
    def register(run: Callable) -> Callable:
        if any(stage.name == name for chain in _chains.values() for stage in chain):
            raise ValueError(f"a stage named {name!r} is registered already")
        _chains[point] += (Stage(name, point, run, own),)
        return run

    return register


def before_execute(*, name: str) -> Callable[[Callable[[StageCall], None | Awaitable[None]]], Callable]:
    """Register the decorated function to run before execute; it refuses by raising StageRefusal."""
    return _register(BEFORE, name)


def after_execute(*, name: str) -> Callable[[Callable[[StageCall, dict], Any]], Callable]:
    """Register the decorated function to run after execute; it returns the result the model will read."""
    return _register(AFTER, name)


def own_after_execute(*, name: str) -> Callable[[Callable[[StageCall, dict], Any]], Callable]:
    """The gateway's own after-execute stage (the result filter); see Stage.own."""
    return _register(AFTER, name, own=True)


def stages(point: str) -> tuple[Stage, ...]:
    return _chains[point]
