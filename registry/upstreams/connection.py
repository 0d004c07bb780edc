"""One live upstream session and what its calls come back as: `UpstreamConnection` (its owner task opens,
serves and closes the client session, and relays the upstream's requests to the call in flight), and the
failures a connect can end in (outcome.py says what a request comes back as). The pool (pool.py) holds them."""

import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
from anyio.abc import TaskStatus
from mcp import types
from mcp.server.subscriptions import PromptsListChanged, ResourcesListChanged, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from registry.rest.document import DocumentRefused
from registry.upstreams.direct import DirectLine
from registry.upstreams.egress import ADDRESS_REFUSED, EgressRefused
from registry.upstreams.health import Witness, connect_cause, found, with_stderr
from registry.upstreams.outcome import DELEGATION_MISSING, DOCUMENT_REFUSED, Outcome, failure
from registry.upstreams.relay import ASKS, LEGACY, LOGGING, PLAIN_LEGACY, RELAYED_CAPABILITIES, Relay, unsupported
from registry.upstreams.spec import UpstreamSpec

logger = logging.getLogger(__name__)

# Connection-level failures: the session is gone and must be reopened (a stdio server that died, say).
CONNECTION_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)
EVERYTHING = frozenset(RELAYED_CAPABILITIES)


class ConnectFailed(Exception):
    """A connect that failed, with its cause for the operator; the original exception is its __cause__."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class NoLegacy(Exception):
    """A 2025-11-25 agents' plain connection to an upstream that answered it has no 2025-11-25: the pool gives
    their calls its shared connection instead (no second start to learn the era that one speaks)."""


def _delegation_refusal(exc: BaseException) -> str | None:
    """The code a guarded specialist refused the delegation token with (handoff/clearance.py), if it did:
    the SDK client raises the JSON-RPC error of its 401 answer."""
    refused = found(exc, lambda e: isinstance(e, MCPError) and isinstance(e.data, dict) and "code" in e.data)
    return refused.data["code"] if refused else None  # type: ignore[attr-defined]


def connect_failure(exc: BaseException) -> Outcome:
    """What a failed connect means for the model: spawn, DNS, handshake, HTTP status or the egress guard."""
    outcome = _connect_failure(exc)
    if failed := found(exc, lambda e: isinstance(e, ConnectFailed)):
        outcome["cause"] = failed.cause  # type: ignore[attr-defined]
    return outcome


def _connect_failure(exc: BaseException) -> Outcome:
    if refused := found(exc, lambda e: isinstance(e, EgressRefused)):
        return failure("UPSTREAM_ADDRESS_REFUSED", ADDRESS_REFUSED, str(refused))
    if refused := found(exc, lambda e: isinstance(e, DocumentRefused)):
        return failure(DOCUMENT_REFUSED, f"The service's OpenAPI document was refused: {refused}")
    if (code := _delegation_refusal(exc)) == "EXPIRED_DELEGATION_TOKEN":
        return failure(code, "The specialist found the delegation expired or already used.", repr(exc))
    if code == DELEGATION_MISSING:
        return failure(code, "The specialist answers only requests a handoff delegated to it.", repr(exc))
    return failure("UPSTREAM_UNAVAILABLE", "The service could not be reached. Try later.", repr(exc))


def closed(exc: MCPError) -> bool:
    """The SDK's word that the connection ended. Its code is also JSON-RPC's first server-error code, which
    upstreams answer their own failures with: the SDK's message, without data, tells the two apart."""
    return exc.code == types.CONNECTION_CLOSED and exc.error.message == "Connection closed" and exc.error.data is None


class UpstreamConnection:
    """One upstream session. `run` is its owner task: it enters and exits the client.

    A connection for agents that declared client capabilities (`capabilities`) runs one call at a time: the
    upstream's requests to the client carry nothing that ties them to a call, so the call in flight (`relay`)
    is the one they belong to. What it declares upstream depends on the era it speaks (`_declares`)."""

    def __init__(
        self,
        spec: UpstreamSpec,
        capabilities: frozenset[str] = frozenset(),
        notice: Callable[[str], None] | None = None,
        on_exit: Callable[["UpstreamConnection"], None] | None = None,
    ) -> None:
        self.spec = spec
        self.capabilities = capabilities
        # Told "tools", "prompts" or "resources" when the upstream says that list changed, UPDATED + uri when a
        # subscribed resource did.
        self.notice = notice
        self.on_exit = on_exit  # told when its stdio server ends while it serves (the pool restarts it)
        self.client: Any = None
        self.direct = DirectLine(spec.slug)  # bound by a stdio server's transport: the plain calls' way
        self.alive = False
        self.started_at = self.last_used = anyio.current_time()
        self.in_flight = 0
        self.relay: Relay | None = None
        self.serial = anyio.Lock()
        self.witness = Witness(self._ended)
        self._stop = anyio.Event()

    async def _log(self, params: types.LoggingMessageNotificationParams) -> None:
        if self.relay is not None:
            await self.relay.log(params.level, params.data, params.logger)

    def _declares(self, legacy: bool) -> frozenset[str]:
        """The client capabilities the session declares upstream. A 2025-11-25 session declares them once for
        every call it will carry, so it declares all the gateway relays: upstreams offer some tools only to
        clients that declare sampling or elicitation, and the relay refuses, call by call, what the agent did
        not declare. A 2026-07-28 request carries the connection's own set (the agents'), so that an upstream
        can refuse what they lack (-32021) rather than use what they never granted."""
        # A handoff tunnel declares nothing either way: it connects once per delegation, never twice.
        return EVERYTHING if legacy and self.spec.grant is None else self.capabilities & EVERYTHING

    def _callbacks(self, declared: frozenset[str]) -> dict[str, Any]:
        """The SDK client's callbacks (and with them the capabilities it declares) for this connection."""
        callbacks: dict[str, Any] = {
            ask.callback: _relaying(self, method) for method, ask in ASKS.items() if ask.capability in declared
        }
        if LOGGING in self.capabilities:  # every level: the agent's end filters (handoff/mcp/agent_relay.py)
            callbacks |= {"logging_callback": self._log, "log_level": "debug"}
        return callbacks | ({"message_handler": self._heard} if self.notice else {})

    async def _attempt(self, mode: str, legacy: bool, **options: Any) -> tuple[Any, AsyncExitStack]:
        """A client connected in `mode`, declaring what a session of that era should, and the stack that holds it."""
        stack = AsyncExitStack()
        self.direct = DirectLine(self.spec.slug)  # the last attempt's is the one the connection keeps
        try:
            callbacks = self._callbacks(self._declares(legacy))
            client = await self.spec.connect(stack, self.witness, self.direct, mode=mode, **options, **callbacks)
        except BaseException:
            await stack.aclose()
            raise
        return client, stack

    async def _connect(self) -> tuple[Any, AsyncExitStack]:
        """The session. A 2025-11-25 agent's speaks that era wherever the upstream does: an upstream that speaks
        both may then ask on the call's stream (the push way), which a 2026-07-28 session has no channel for.
        Otherwise the newest era the upstream speaks (`auto`), declaring what that era wants: the era the last
        sync saw is the guess, and a wrong guess costs a second connect."""
        if self.spec.transport == "rest":  # no era to agree on
            return await self._attempt("rest", legacy=True)
        if LEGACY in self.capabilities:
            try:
                return await self._attempt("legacy", legacy=True)
            except Exception as exc:
                # An upstream that answered it has no 2025-11-25; one that ended (or closed) is failing either way.
                if not found(exc, lambda e: isinstance(e, MCPError) and not closed(e)):
                    raise
                if self.capabilities == PLAIN_LEGACY:
                    raise NoLegacy(self.spec.slug) from exc
                logger.info("upstream %s: no 2025-11-25 session, so 2026-07-28 (%r)", self.spec.slug, exc)
        guess = self.spec.legacy
        client, stack = await self._attempt("auto", guess)
        legacy = client.protocol_version not in MODERN_PROTOCOL_VERSIONS
        if self._declares(legacy) == self._declares(guess):
            return client, stack
        version, discovered = client.protocol_version, client.session.discover_result
        await stack.aclose()
        if legacy:
            return await self._attempt("legacy", legacy=True)
        return await self._attempt(version, legacy=False, prior_discover=discovered)

    async def _heard(self, message: Any) -> None:
        """A 2025-11-25 upstream's notifications: list changes, and updates of subscribed resources."""
        if not self.notice:
            return
        if kind := CHANGES.get(type(message)):
            self.notice(kind)
        elif isinstance(message, types.ResourceUpdatedNotification):
            self.notice(f"{UPDATED}{message.params.uri}")

    async def _listen(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """A 2026-07-28 upstream tells its changes on a `subscriptions/listen` stream, which is acknowledged
        before the connection is used (a change made by its first call would go unheard otherwise)."""
        assert self.notice is not None
        listening = False
        try:
            everything = {"tools_list_changed": True, "prompts_list_changed": True, "resources_list_changed": True}
            async with self.client.listen(**everything) as subscription:
                task_status.started()
                listening = True
                async for event in subscription:
                    if kind := CHANGES.get(type(event)):
                        self.notice(kind)
        except MCPError as refused:  # an upstream without the feature: its changes go unheard
            logger.info("upstream %s: no change subscription (%s)", self.spec.slug, refused.error.message)
        except Exception:  # a lost stream: changes go unheard until the connection is reopened
            if not self.witness.ending:  # else its server ended, which the pool reports in one line
                logger.info("upstream %s: change subscription ended", self.spec.slug, exc_info=True)
        if not listening:  # the connection is used all the same, unlistened
            task_status.started()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        try:
            self.client, stack = await self._connect()
            async with stack:
                async with anyio.create_task_group() as tg:
                    if self.notice and self.client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                        await tg.start(self._listen)
                    self.alive = started = True
                    self.started_at = anyio.current_time()
                    task_status.started()
                    await self._stop.wait()
                    tg.cancel_scope.cancel()
        except NoLegacy:
            raise
        except Exception as exc:
            if not started:
                raise ConnectFailed(connect_cause(exc, self.spec, self.witness)) from exc
            # The owner must never take the pool down with it; the next call reconnects.
            logger.warning("upstream %s: session ended with an error", self.spec.slug, exc_info=True)
        finally:
            self.alive = False
            self.witness.close()

    def cause(self, what: str) -> str:
        """Why the connection failed during a call, for the operator."""
        return with_stderr(what, self.spec, self.witness)

    def stop(self) -> None:
        self.alive = False
        self._stop.set()

    def _ended(self) -> None:
        """Its stdio server ended (or closed its output) on its own: the connection is dead from now on. Not
        while it starts (the connect fails and says how) nor once stopped (the gateway ended it)."""
        if self.alive:
            self.stop()
            if self.on_exit is not None:
                self.on_exit(self)


def _relaying(connection: UpstreamConnection, method: str) -> Callable[..., Awaitable[Any]]:
    """The callback that hands the upstream's request to the agent of the call in flight."""

    async def callback(context: Any, params: Any = None) -> Any:
        relay = connection.relay
        if relay is None and connection.capabilities <= PLAIN_LEGACY:  # a plain connection's agents declared nothing
            return unsupported(method).error
        if relay is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message=f"No call in flight to relay {method} to.")
        wire = params.model_dump(mode="json", by_alias=True, exclude_none=True) if params is not None else {}
        try:
            return ASKS[method].result.model_validate(await relay.ask(method, wire))
        except MCPError as refused:
            return refused.error

    return callback


# An upstream's change notifications and events, by the list they are about.
CHANGES: dict[type, str] = {
    types.ToolListChangedNotification: "tools",
    types.PromptListChangedNotification: "prompts",
    types.ResourceListChangedNotification: "resources",
    ToolsListChanged: "tools",
    PromptsListChanged: "prompts",
    ResourcesListChanged: "resources",
}
UPDATED = "updated:"  # a change of kind "updated:<uri>": that resource changed
