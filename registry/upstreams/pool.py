"""The upstream pool: live upstream sessions, each opened and closed by its own owner task.

Runs on the executor's event loop (registry/upstreams/loop.py). Every result leaves as plain JSON (an `Outcome`),
so the inline and the Celery executor hand the dispatcher exactly the same thing.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from django.conf import settings
from mcp import types
from mcp.server.subscriptions import ResourceUpdated
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from registry.personal import PERSON_REQUIRED
from registry.upstreams.connection import (
    CONNECTION_ERRORS,
    UPDATED,
    NoLegacy,
    UpstreamConnection,
    closed,
    connect_failure,
)
from registry.upstreams.health import outcome_health
from registry.upstreams.outcome import (
    CONNECT_TIMEOUT,
    DELEGATION_MISSING,
    MISSING_CLIENT_CAPABILITY,
    TUNNEL_GONE,
    Outcome,
    failure,
)
from registry.upstreams.person import PERSON_REQUIRED_MESSAGE, REFRESH_MARGIN_SECONDS, CredentialUnusable
from registry.upstreams.relay import PLAIN_LEGACY, Relay
from registry.upstreams.reply_depth import reply_too_deep
from registry.upstreams.requests import (
    CALL_TOOL,
    UNSUPPORTED,
    Action,
    Unsupported,
    UpstreamRequest,
    calling,
    catalog,
    forwarding,
    list_every_page,
    tools_listed,
)
from registry.upstreams.rest import CallFailed
from registry.upstreams.scrub import ScrubbedRelay, scrubbed
from registry.upstreams.spec import UpstreamSpec
from registry.upstreams.stdio import Delivery, sending

logger = logging.getLogger(__name__)

# The upstream, the client capabilities the connection declares, and whose it is: a person's digest for a
# per-person upstream's, "" for the shared one (a per-person upstream's serves only its catalog).
ConnectionKey = tuple[int, frozenset[str], str]
PERSON_PROCESSES_FULL = "PERSON_PROCESSES_FULL"
NEVER_REACHED = "The call never reached the service, so it is safe to retry."
MAY_HAVE_RUN = "The call may or may not have run: retry only if it is safe to repeat."
Reopen = Callable[[], Awaitable[UpstreamConnection | Outcome]]


class ProcessesFull(Exception):
    """A per-person stdio upstream runs a process for as many people as it may, all of them busy."""


def _serves(connection: UpstreamConnection, revision: int, person: dict | None, catalog: bool) -> bool:
    """Whether an open connection may carry this request as it is."""
    spec = connection.spec
    if not connection.alive or spec.revision < revision:
        return False
    if spec.expires_at and spec.expires_at - REFRESH_MARGIN_SECONDS < time.time():
        return False  # its credential runs out: a new connection refreshes it
    if person is None:
        return catalog or not spec.per_person
    if spec.person_credential != person.get("id", 0):
        return False  # another credential of theirs: they disconnected and connected again, the old one is gone
    # The same credential: this version, or a newer one (the executor refreshed it after the call's was read).
    current, wanted = spec.person_version, str(person["version"])
    return current == wanted or (current.isdigit() and wanted.isdigit() and int(current) > int(wanted))


def _lost(connection: UpstreamConnection, sent: Delivery, what: str, detail: str) -> Outcome:
    """A request whose connection ended under it (`what` happened), which is stopped: the next request gets a
    new one. A request a stdio server's transport never wrote never reached it (`unsent`). The audit's detail
    says how the server ended (a limit it was killed at, a signal, a status), which its exception does not."""
    connection.stop()
    ending = connection.witness.ending
    detail = f"{detail}: the server {ending}" if ending else detail
    if connection.spec.transport == "stdio" and not sent.written:
        ended = ending or "had stopped taking requests"
        message = f"The service's process {ended} before the call reached it. {NEVER_REACHED}"
        cause = connection.cause("a call found the server gone")
        return failure("UPSTREAM_UNAVAILABLE", message, detail) | {"cause": cause, "unsent": True}
    if ending:
        message = f"The service's process {ending} during the call; it is being restarted. {MAY_HAVE_RUN}"
    else:
        message = f"The service's connection was lost during the call; it will be opened again. {MAY_HAVE_RUN}"
    return failure("UPSTREAM_UNAVAILABLE", message, detail) | {"cause": connection.cause(f"{what} during a call")}


class UpstreamPool:
    """Shared sessions, one per upstream and declared capability set, reopened when the upstream's revision
    changes or it dies."""

    def __init__(
        self,
        load_spec: Callable[[int, dict | None, bool], Awaitable[UpstreamSpec]],
        on_change: Callable[[int, str], Awaitable[None]] | None = None,
        on_health: Callable[[int, str, str], Awaitable[None]] | None = None,
    ) -> None:
        self._load_spec = load_spec
        self._on_change = on_change
        self._on_health = on_health
        self._health: dict[int, tuple[str, str, float]] = {}  # upstream -> the health last stored, and when
        self._changing: dict[tuple[int, str], bool] = {}  # a change being handled -> another came meanwhile
        self._watches: dict[tuple[int, str], anyio.CancelScope] = {}  # resources subscribed at 2026-07-28 upstreams
        self._connections: dict[ConnectionKey, UpstreamConnection] = {}
        self._restart_waits: dict[ConnectionKey, float] = {}  # how long the last restart of each waited
        self._tunnels: dict[str, UpstreamConnection] = {}
        self._locks: dict[ConnectionKey, anyio.Lock] = {}
        # upstream -> the revision at which it was found to speak one era: its agents' plain calls share a connection
        self._one_era: dict[int, int] = {}
        self._task_group: TaskGroup | None = None

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hold the task group that every owner task runs in, and close idle sessions, until cancelled."""
        idle = settings.GATEWAY_UPSTREAM_IDLE_SECONDS
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            task_status.started()
            try:
                while True:
                    await anyio.sleep(min(idle / 2, 30))
                    self.close_idle(idle)
            finally:
                for connection in [*self._connections.values(), *self._tunnels.values()]:
                    connection.stop()

    def close_idle(self, idle_seconds: float) -> None:
        """Stop sessions unused for `idle_seconds` (and so the stdio servers behind them); the next call
        reopens one. Upstreams that were deleted or disabled go away this way too."""
        now = anyio.current_time()
        for key, connection in list(self._connections.items()):
            connection.witness.trim()
            if not connection.in_flight and now - connection.last_used >= idle_seconds:
                connection.stop()
                del self._connections[key]
                self._restart_waits.pop(key, None)
        # The gateway sweeps tunnels at their idle timeout; one it lost track of (its opener left while it
        # connected) is closed here at twice that, whatever the records say.
        for tunnel_id, connection in list(self._tunnels.items()):
            assert connection.spec.grant is not None
            if not connection.in_flight and now - connection.last_used >= 2 * connection.spec.grant["idle_timeout"]:
                self.tunnel_close(tunnel_id)

    async def _connection(
        self,
        upstream_id: int,
        revision: int,
        capabilities: frozenset[str],
        person: dict | None = None,
        catalog: bool = False,
    ) -> UpstreamConnection:
        key = (upstream_id, capabilities, person["person"] if person else "")
        # Most calls find their connection serving: no lock to take (one opening a new one deletes the old first).
        if served := self._serving(key, revision, person, catalog):
            return served
        if key not in self._locks:
            self._locks[key] = anyio.Lock(fast_acquire=True)  # no checkpoint when uncontended
        async with self._locks[key]:
            if served := self._serving(key, revision, person, catalog):
                return served
            current = self._connections.get(key)
            if current and current.alive and current.spec.per_person and person is None and not catalog:
                raise CredentialUnusable(PERSON_REQUIRED, PERSON_REQUIRED_MESSAGE)
            if current:
                current.stop()
                del self._connections[key]
            spec = await self._load_spec(upstream_id, person, catalog)
            if capabilities == PLAIN_LEGACY and (spec.legacy or spec.transport == "rest"):
                return await self._one_era_found(spec, revision, person, catalog)
            if spec.per_person and spec.transport == "stdio" and person is not None:
                self._make_room(upstream_id)
            # The plain connections hear the upstream's changes for all (the others would repeat them); a change
            # both hear is handled once, or twice if the second comes after the handling began (_changed).
            plain = self._on_change is not None and capabilities <= PLAIN_LEGACY
            notice = partial(self._changed, upstream_id) if plain else None
            reopen = partial(self._open, upstream_id, revision, capabilities, person, catalog)
            connection = UpstreamConnection(spec, capabilities, notice, partial(self._exited, key, reopen))
            assert self._task_group is not None, "the pool is not serving"
            try:
                with anyio.fail_after(settings.GATEWAY_CONNECT_TIMEOUT):
                    await self._task_group.start(connection.run)
            except NoLegacy:  # the upstream has no 2025-11-25: the shared connection is as good
                logger.info("upstream %s: no 2025-11-25, so its 2025-11-25 agents share one connection", spec.slug)
                return await self._one_era_found(spec, revision, person, catalog)
            self._connections[key] = connection
            return connection

    async def _one_era_found(
        self, spec: UpstreamSpec, revision: int, person: dict | None, catalog: bool
    ) -> UpstreamConnection:
        """The shared connection, for an upstream that speaks one era (or none: REST): a 2025-11-25 agent's plain
        calls go there too from now on, until the upstream's revision changes."""
        self._one_era[spec.id] = spec.revision
        return await self._connection(spec.id, revision, frozenset(), person, catalog)

    def _serving(
        self, key: ConnectionKey, revision: int, person: dict | None, catalog: bool
    ) -> UpstreamConnection | None:
        """The open connection under `key`, if it may carry this request as it is."""
        current = self._connections.get(key)
        if current and _serves(current, revision, person, catalog):
            current.last_used = anyio.current_time()
            return current
        return None

    def _make_room(self, upstream_id: int) -> None:
        """Keep a per-person stdio upstream's processes under GATEWAY_PERSON_PROCESSES: the least recently used
        idle one stops for a new person; if none is idle, ProcessesFull."""
        mine = [(k, c) for k, c in self._connections.items() if k[0] == upstream_id and k[2]]
        if len(mine) < settings.GATEWAY_PERSON_PROCESSES:
            return
        idle = sorted((c.last_used, k) for k, c in mine if not c.in_flight)
        if not idle:
            raise ProcessesFull(upstream_id)
        self._connections.pop(idle[0][1]).stop()

    def _exited(self, key: ConnectionKey, reopen: Reopen, connection: UpstreamConnection) -> None:
        """Its stdio server ended on its own: the upstream is failing from now on, with how the server ended,
        and the server is started again after a wait (a call that comes first starts it itself)."""
        if self._connections.get(key) is connection:
            del self._connections[key]
        wait = self._restart_wait(key, anyio.current_time() - connection.started_at)
        ending, cause = connection.witness.ending, connection.cause(f"the server {connection.witness.ending}")
        logger.warning("upstream %s: its server %s; starting it again in %g s", connection.spec.slug, ending, wait)
        assert self._task_group is not None
        self._task_group.start_soon(self._restart, key, reopen, cause, wait, connection.last_used)

    def _restart_wait(self, key: ConnectionKey, lived: float) -> float:
        """Wait as an open circuit does: GATEWAY_BREAKER_FIRST_OPEN_SECONDS after a server that had served a
        while, twice the last wait after one that ended soon after it started (or did not start), never more
        than GATEWAY_BREAKER_RECOVERY_SECONDS."""
        first, most = settings.GATEWAY_BREAKER_FIRST_OPEN_SECONDS, settings.GATEWAY_BREAKER_RECOVERY_SECONDS
        last = self._restart_waits.get(key)
        self._restart_waits[key] = wait = first if last is None or lived >= most else min(2 * last, most)
        return wait

    async def _restart(self, key: ConnectionKey, reopen: Reopen, cause: str, wait: float, last_used: float) -> None:
        await self._observed(key[0], {"ok": False, "cause": cause})
        while True:
            await anyio.sleep(wait)
            current, unused = self._connections.get(key), anyio.current_time() - last_used
            if (current and current.alive) or unused >= settings.GATEWAY_UPSTREAM_IDLE_SECONDS:
                return  # a call started it meanwhile, or it went unused for long: the next call starts it
            opened = await reopen()
            if isinstance(opened, UpstreamConnection):
                opened.last_used = last_used  # idle since the last call, not since the restart
                await self._observed(key[0], {"ok": True})
                return
            await self._observed(key[0], opened)
            if "cause" not in opened:
                return  # not the server's doing (a person's credential gone, say): the next call tries again
            wait = self._restart_wait(key, 0.0)

    def _changed(self, upstream_id: int, kind: str) -> None:
        """Handle a change in the background (never in the client's notification handler, which would
        block it); changes that come while one is handled are handled once more after it."""
        key = (upstream_id, kind)
        if key in self._changing:
            self._changing[key] = True
            return
        self._changing[key] = False
        assert self._task_group is not None
        self._task_group.start_soon(self._handle_change, key)

    async def _handle_change(self, key: tuple[int, str]) -> None:
        assert self._on_change is not None
        try:
            while True:
                self._changing[key] = False
                try:
                    await self._on_change(*key)
                except Exception:
                    logger.warning("upstream %s: handling a %s change failed", key[0], key[1], exc_info=True)
                if not self._changing[key]:
                    return
        finally:
            del self._changing[key]

    async def _open(
        self,
        upstream_id: int,
        revision: int,
        capabilities: frozenset[str],
        person: dict | None = None,
        catalog: bool = False,
    ) -> UpstreamConnection | Outcome:
        """The connection, or the Outcome that says why there is none."""
        try:
            return await self._connection(upstream_id, revision, capabilities, person, catalog)
        except CredentialUnusable as unusable:
            return failure(unusable.code, unusable.message)
        except ProcessesFull:
            most = settings.GATEWAY_PERSON_PROCESSES
            busy = (
                f"This service already runs as many processes for people as it may ({most}), all busy: try again soon."
            )
            return failure(PERSON_PROCESSES_FULL, busy, f"GATEWAY_PERSON_PROCESSES ({most}) reached, none idle")
        except TimeoutError:
            waited = settings.GATEWAY_CONNECT_TIMEOUT
            return CONNECT_TIMEOUT | {"cause": f"connect timeout: no answer within {waited:g} s"}
        except Exception as exc:  # any way a connect can fail
            return connect_failure(exc)

    async def _watch(self, upstream_id: int, revision: int, method: str, uri: str) -> Outcome:
        """Resource subscriptions. A 2025-11-25 upstream keeps them itself; a 2026-07-28 one tells of updates on
        a `subscriptions/listen` stream per resource, held here. Either way they belong to the shared connection
        (which hears the updates), not to one agent: agents' own subscriptions are the gateway's business."""
        connection = await self._open(upstream_id, revision, frozenset())
        if not isinstance(connection, UpstreamConnection):
            return connection
        if connection.client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await self._request(connection, forwarding(method, {"uri": uri}))
        key = (upstream_id, uri)
        if method == "resources/subscribe" and key not in self._watches:
            self._watches[key] = anyio.CancelScope()
            assert self._task_group is not None
            self._task_group.start_soon(self._watching, connection, uri, self._watches[key])
        elif method == "resources/unsubscribe" and key in self._watches:
            self._watches.pop(key).cancel()
        return {"ok": True, "result": {}}

    async def _watching(self, connection: UpstreamConnection, uri: str, scope: anyio.CancelScope) -> None:
        with scope:
            try:
                async with connection.client.listen(resource_subscriptions=[uri]) as subscription:
                    async for event in subscription:
                        if isinstance(event, ResourceUpdated) and connection.notice:
                            connection.notice(f"{UPDATED}{event.uri}")
            except Exception:  # the connection ended: the subscription with it (agents subscribe again)
                if not connection.witness.ending:  # else its server ended, which _exited reports in one line
                    logger.info("upstream %s: subscription to %s ended", connection.spec.slug, uri, exc_info=True)
        self._watches.pop((connection.spec.id, uri), None)

    async def _run(
        self,
        upstream_id: int,
        revision: int,
        action: Action,
        relay: Relay | None = None,
        person: dict | None = None,
        catalog: bool = False,
        legacy: bool = False,
    ) -> Outcome:
        """Run one request on the upstream's session for the relay's capabilities (and the person's, on a
        per-person upstream; and the agent's era, `legacy`), turn every failure into a specific Outcome, and
        note what it shows of the upstream's health."""
        outcome = await self._attempt_request(upstream_id, revision, action, relay, person, catalog, legacy)
        await self._observed(upstream_id, outcome)
        return outcome

    async def _observed(self, upstream_id: int, outcome: Outcome) -> None:
        """Store the health an outcome shows when it differs from what this process last stored, or that is
        older than a probe interval (another process may have stored something else since): not every call
        writes the upstream's row."""
        health = outcome_health(outcome)
        if health is None or self._on_health is None:
            return
        now = anyio.current_time()
        state, cause, stored_at = self._health.get(upstream_id, ("", "", -float("inf")))
        if (state, cause) == health and now - stored_at < settings.GATEWAY_HEALTH_PROBE_SECONDS:
            return
        self._health[upstream_id] = (*health, now)
        try:
            await self._on_health(upstream_id, *health)
        except Exception:  # a database hiccup must not fail the call; the next outcome stores it again
            self._health.pop(upstream_id, None)
            logger.warning("upstream %s: storing its health failed", upstream_id, exc_info=True)

    async def _attempt_request(
        self,
        upstream_id: int,
        revision: int,
        action: Action,
        relay: Relay | None,
        person: dict | None,
        catalog: bool,
        legacy: bool = False,
    ) -> Outcome:
        capabilities = relay.capabilities if relay else frozenset()
        if legacy and not capabilities and self._one_era.get(upstream_id, -1) < revision:
            # A 2025-11-25 agent's plain call goes in its era where the upstream speaks both: an SDK server spends
            # less on it than on a 2026-07-28 request (docs/benchmarks.md). A connection of its own, unserialised.
            capabilities = PLAIN_LEGACY
        opening = partial(self._open, upstream_id, revision, capabilities, person, catalog)
        outcome = await self._on(await opening(), action, relay)
        if not outcome.get("unsent"):
            return outcome
        # Its server had ended before the request was written, unnoticed until then: nothing ran, so a new
        # server gets it, once.
        logger.info("upstream %s: a request found its server gone; sending it once more", upstream_id)
        return await self._on(await opening(), action, relay, retry=True)

    async def _on(
        self,
        connection: UpstreamConnection | Outcome,
        action: Action,
        relay: Relay | None,
        retry: bool = False,
    ) -> Outcome:
        """The request on `connection`, or the Outcome that says why there is none."""
        if not isinstance(connection, UpstreamConnection):
            # A retry that cannot connect did not reach the service either.
            never = {"unsent": True, "message": f"{connection['message']} {NEVER_REACHED}"}
            return connection | never if retry else connection
        secrets = connection.spec.secrets
        relay = ScrubbedRelay(relay, secrets) if relay is not None and secrets else relay
        if relay is None or not relay.capabilities:
            return scrubbed(await self._request(connection, action, relay), secrets)
        async with connection.serial:
            connection.relay = relay
            try:
                return scrubbed(await self._request(connection, action, relay), secrets)
            finally:
                connection.relay = None

    async def _request(self, connection: UpstreamConnection, action: Action, relay: Relay | None = None) -> Outcome:
        spec, sent = connection.spec, Delivery()
        connection.in_flight += 1
        token = sending.set(sent)
        try:
            # The pool runs on asyncio alone (loop.py): its own deadline costs half of anyio's scope a call.
            async with asyncio.timeout(spec.timeout):
                return {"ok": True, "result": await action(connection, relay)}
        except TimeoutError:
            return failure("UPSTREAM_TIMEOUT", f"The service did not answer within {spec.timeout:g} seconds.")
        except MCPError as exc:
            if reply_too_deep(exc):  # registry/upstreams/reply_depth.py stood in for the reply
                return failure("UPSTREAM_INVALID_RESPONSE", exc.message)
            if closed(exc):
                return _lost(connection, sent, "the connection closed", repr(exc))
            refused = failure("UPSTREAM_ERROR", f"The service refused the request: {exc.message}", repr(exc))
            refused["rpc_code"] = exc.code  # passed-through requests answer with the upstream's own code
            if exc.code == MISSING_CLIENT_CAPABILITY and isinstance(exc.error.data, dict):
                refused["rpc_data"] = exc.error.data  # names the capability the agent must declare
            # The upstream judged the arguments: its words tell the model how to fix them, so redaction spares them.
            return refused | {"validation": True} if exc.code == types.INVALID_PARAMS else refused
        except Unsupported as exc:
            return failure(UNSUPPORTED, f"The service does not offer {exc}.")
        except CallFailed as exc:  # a REST service's (registry/upstreams/rest.py)
            failed = failure(exc.code, exc.message, exc.detail)
            return failed | {"validation": True} if exc.validation else failed
        except (ValidationError, RuntimeError) as exc:
            # The SDK client raises RuntimeError when structured content is missing or breaks the tool's
            # own output schema (ClientSession.validate_tool_result), ValidationError for malformed results.
            return failure("UPSTREAM_INVALID_RESPONSE", "The service sent a malformed response.", str(exc))
        except CONNECTION_ERRORS as exc:
            return _lost(connection, sent, f"the connection broke ({type(exc).__name__})", repr(exc))
        finally:
            sending.reset(token)
            connection.in_flight -= 1
            connection.last_used = anyio.current_time()

    async def request(self, request: UpstreamRequest, relay: Relay | None = None) -> Outcome:
        """A tool call, or a resources, prompts or completion request (requests.FORWARDED) when the upstream
        offers the feature; with `relay`, what the upstream asks meanwhile goes to the agent."""
        upstream_id, revision, method, params = request.upstream_id, request.revision, request.method, request.params
        if method == CALL_TOOL:
            action = calling(params["name"], params.get("arguments") or {}, request.traceparent, request.rounds)
        elif method in ("resources/subscribe", "resources/unsubscribe"):
            return await self._watch(upstream_id, revision, method, str(params.get("uri", "")))
        else:
            action = forwarding(method, params, request.rounds)
        return await self._run(upstream_id, revision, action, relay, request.person, legacy=request.legacy)

    async def list_tools(self, upstream_id: int, revision: int) -> Outcome:
        return await self._run(upstream_id, revision, catalog, catalog=True)

    async def probe(self, upstream_id: int, revision: int, specialist: bool = False) -> Outcome:
        """List the upstream's tools to learn its health. A specialist (a handoff-only upstream) serves only
        requests a handoff delegated to it, which a probe is not: its guard's refusal for want of a delegation
        is its answer."""
        if not specialist:
            return await self._run(upstream_id, revision, tools_listed, catalog=True)
        outcome = await self._attempt_request(upstream_id, revision, tools_listed, None, None, True)
        await self._observed(upstream_id, {"ok": True} if outcome.get("code") == DELEGATION_MISSING else outcome)
        return outcome

    # Handoff tunnels: a session of their own per agent session, opened with the delegation in `spec`,
    # never shared, never reopened behind the gateway's back (a new token means a new handoff).

    async def tunnel_open(
        self, tunnel_id: str, upstream_id: int, grant: dict[str, Any], connect_timeout: float
    ) -> Outcome:
        """Open the tunnel with the delegation `grant` and list the specialist's tools, within `connect_timeout`."""
        assert self._task_group is not None, "the pool is not serving"
        connection = UpstreamConnection(replace(await self._load_spec(upstream_id, None, False), grant=grant))
        try:
            with anyio.fail_after(connect_timeout):
                await self._task_group.start(connection.run)
                self._tunnels[tunnel_id] = connection
                tools = await list_every_page(connection.client)
        except TimeoutError:
            self.tunnel_close(tunnel_id)
            connection.stop()
            return CONNECT_TIMEOUT
        except Exception as exc:
            self.tunnel_close(tunnel_id)
            return connect_failure(exc)
        return {"ok": True, "result": {"tools": tools}}

    async def tunnel_call(self, tunnel_id: str, tool: str, arguments: dict[str, Any]) -> Outcome:
        connection = self._tunnels.get(tunnel_id)
        if connection is None or not connection.alive:
            return failure(TUNNEL_GONE, "The specialist's connection is gone.", f"tunnel {tunnel_id} not held here")
        outcome = await self._request(connection, calling(tool, arguments))
        return outcome | {"code": TUNNEL_GONE} if outcome.get("code") == "UPSTREAM_UNAVAILABLE" else outcome

    def tunnel_close(self, tunnel_id: str) -> bool:
        connection = self._tunnels.pop(tunnel_id, None)
        if connection:
            connection.stop()
        return connection is not None

    def tunnel_ids(self) -> list[str]:
        return list(self._tunnels)
