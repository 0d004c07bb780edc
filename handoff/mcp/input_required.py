"""Upstream requests to the client, for 2026-07-28 agents, which have no back-channel: they get an
input-required result and answer it by calling again with `inputResponses` and the `requestState`.

A 2026-07-28 upstream asks the same way: its input-required result is passed through, its own
`requestState` wrapped in the gateway's, and the retry goes to the upstream as a call of its own. Nothing
is held between the rounds, so any web process may take the retry.

A 2025-11-25 upstream asks with a request on the call's stream: the call is parked, going on in this
process, while the agent gets an input-required result whose state names the parked call; the retry
brings the answers to it, and gets its result or the upstream's next question. A parked call nobody
answers in time is cancelled, and so is the upstream's call.

Every `requestState` the gateway gives out is signed (HMAC, Django's signing), bound to the agent, the
upstream and the tool, and expires.
"""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core import signing
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError

from handoff.mcp.agent_relay import log_to
from handoff.mcp.caller import Caller
from registry.upstreams.outcome import MISSING_CLIENT_CAPABILITY
from registry.upstreams.relay import ASKS, may_ask, unsupported
from registry.upstreams.requests import INPUT_RESPONSES

logger = logging.getLogger(__name__)

SALT = "switchboard.request-state"
GATHER_SECONDS = 0.05  # an upstream that asks several things at once: they go out in one result


@dataclass
class Question:
    method: str
    params: dict[str, Any]
    answer: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class ParkedCall:
    """One call of a 2026-07-28 agent, and the relay its upstream's questions and progress go through."""

    wanted = True

    def __init__(self, caller: Caller, name: str, upstream: str, capabilities: frozenset[str]) -> None:
        self.id = uuid.uuid4().hex
        self.caller, self.name, self.upstream = caller, name, upstream
        self.capabilities = capabilities
        self.questions: dict[str, Question] = {}
        self.asked = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.ctx: ServerRequestContext | None = None  # the agent's request waiting now, if any

    # The relay the executor sees (registry/upstreams/relay.py).

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        if self.ctx is not None:
            with contextlib.suppress(Exception):  # the request it rode on may have ended meanwhile
                await self.ctx.session.report_progress(progress, total, message)

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        if self.ctx is not None:
            with contextlib.suppress(Exception):  # the request it rode on may have ended meanwhile
                await log_to(self.ctx, level, data, logger)

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if not may_ask(method, self.capabilities):
            raise unsupported(method)
        key = f"{ASKS[method].capability}-{len(self.questions) + 1}"
        self.questions[key] = question = Question(method, params)
        self.asked.set()
        return await question.answer

    # The agent's side.

    def unanswered(self) -> dict[str, Question]:
        return {key: q for key, q in self.questions.items() if not q.answer.done()}

    def answer(self, responses: dict[str, Any]) -> None:
        for key, question in self.unanswered().items():
            if key in responses:
                question.answer.set_result(responses[key])

    async def respond(self, ctx: ServerRequestContext) -> Any:
        """The call's result once it ends, or an input-required result for the questions now open."""
        assert self.task is not None
        self.ctx = ctx
        try:
            while not self.unanswered() and not self.task.done():
                self.asked.clear()
                asked = asyncio.ensure_future(self.asked.wait())
                try:
                    await asyncio.wait({asked, self.task}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    asked.cancel()
                if not self.task.done():
                    await asyncio.sleep(GATHER_SECONDS)
        finally:
            self.ctx = None
        if open_questions := self.unanswered():
            return self._input_required(open_questions)
        PARKED.pop(self.id, None)
        return self.task.result()

    def _input_required(self, questions: dict[str, Question]) -> types.InputRequiredResult:
        requests = {
            key: ASKS[q.method].request.model_validate({"method": q.method, "params": q.params})
            for key, q in questions.items()
        }
        token = state_sign(self.caller, self.name, self.upstream, c=self.id)
        return types.InputRequiredResult(input_requests=requests, request_state=token)

    def expire(self) -> None:
        """Nobody answered in time: the call is cancelled (the upstream hears of it; the audit records it)."""
        if self.unanswered() and self.task is not None and not self.task.done():
            logger.info("parked call %s of %s expired unanswered", self.id, self.name)
            self.task.cancel()
        PARKED.pop(self.id, None)


PARKED: dict[str, ParkedCall] = {}


async def park(
    ctx: ServerRequestContext,
    caller: Caller,
    name: str,
    upstream: str,
    capabilities: frozenset[str],
    run: Callable[[ParkedCall], Awaitable[Any]],
) -> Any:
    """Run the call as a task of its own that outlives this request, should the upstream ask something."""
    parked = ParkedCall(caller, name, upstream, capabilities)
    PARKED[parked.id] = parked
    parked.task = asyncio.ensure_future(run(parked))
    asyncio.get_running_loop().call_later(settings.GATEWAY_INPUT_WAIT_SECONDS, parked.expire)
    return await parked.respond(ctx)


class InvalidRequestState(MCPError):
    def __init__(self, message: str) -> None:
        super().__init__(types.INVALID_PARAMS, message, {"code": "INVALID_REQUEST_STATE"})


def state_sign(caller: Caller, name: str, upstream: str, **content: Any) -> str:
    return signing.dumps({"a": list(caller.principal), "n": name, "u": upstream} | content, salt=SALT, compress=True)


def state_load(caller: Caller, name: str, upstream: str, request_state: str) -> dict[str, Any]:
    """What a retry's requestState holds, if it is genuine, this agent's (and person's), for this tool of this upstream
    (a name an administrator moved to another upstream meanwhile does not count), and not expired."""
    try:
        state = signing.loads(request_state, salt=SALT, max_age=settings.GATEWAY_INPUT_WAIT_SECONDS)
    except signing.SignatureExpired:
        raise InvalidRequestState(f"This requestState has expired: call {name} again without it.") from None
    except (signing.BadSignature, ValueError):
        raise InvalidRequestState("Invalid requestState: send back the one the gateway gave, unchanged.") from None
    if not isinstance(state, dict) or state.get("a") != list(caller.principal) or state.get("n") != name:
        raise InvalidRequestState("Invalid requestState: it was issued for another agent or tool.")
    if state.get("u") != upstream:
        raise InvalidRequestState(f"This requestState no longer applies: {name} has changed; call it again without it.")
    return state


def passed_through(
    caller: Caller, name: str, upstream: str, result: dict[str, Any], capabilities: frozenset[str]
) -> dict[str, Any]:
    """A 2026-07-28 upstream's input-required result as the agent gets it: its state wrapped in the gateway's,
    and only if it asks what the agent declared the capability for (else UndeclaredAsk)."""
    requests = result.get("inputRequests") or {}
    undeclared = sorted({str(r.get("method")) for r in requests.values() if not may_ask(r.get("method"), capabilities)})
    if undeclared:
        raise UndeclaredAsk(
            f"{name}: the service asked for {', '.join(undeclared)}, which this client did not declare."
        )
    return result | {"requestState": state_sign(caller, name, upstream, s=result.get("requestState"))}


class UndeclaredAsk(MCPError):
    """An upstream asked the agent for what it did not declare: never forwarded."""

    def __init__(self, message: str) -> None:
        super().__init__(MISSING_CLIENT_CAPABILITY, message, {"code": "UNDECLARED_CAPABILITY"})


def parked_call(state: dict[str, Any], name: str) -> ParkedCall:
    """The parked call a (verified) requestState names."""
    parked = PARKED.get(state.get("c", ""))
    if parked is None:
        raise InvalidRequestState(
            f"This requestState is no longer open (answered, expired, or held by another gateway process): "
            f"call {name} again without it."
        )
    return parked


def responses_of(params: Any) -> dict[str, Any]:
    """A retry's `inputResponses` as JSON, to pass on."""
    return INPUT_RESPONSES.dump_python(params.input_responses or {}, mode="json", by_alias=True, exclude_none=True)
