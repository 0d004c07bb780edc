"""The request object of a tools/call: what the stages know of one call, in the one place that carries it."""

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mcp.server.context import ServerRequestContext
from opentelemetry.trace import Span

from audit.telemetry import current_span, stage_spans_wanted
from handoff.mcp.caller import Caller
from handoff.mcp.unverified import Unverified
from handoff.protocol.tunnels import SessionTunnel
from handoff.snapshot import Snapshot, TriageEntry
from handoff.snapshot_tools import Route
from policy.decisions import Denial, SignOffTerms
from policy.limits.admission import Admission
from registry.overrides import Override
from registry.personal import CredentialRef
from registry.upstreams.outcome import Outcome
from registry.upstreams.relay import Relay

if TYPE_CHECKING:
    from handoff.mcp.pipeline.task_state import CallTask

# Who made the call, which decides how it is answered: an agent (a JSON-RPC result or error), code in an
# execution (what the sandbox resolves `await tools.x.y()` to), an operator's console test (a ConsoleCall).
AGENT, CODE, CONSOLE = "agent", "code", "console"

# The gateway's own tools, as the route stage finds them: handoff moves, and code mode's (by their policy names).
ACTIVATE, RETURN, EXECUTE = "activate", "return", "execute"

OwnRun = Callable[["Call"], Awaitable[Outcome]]


@dataclass(slots=True)  # no dict per call: a call held for sign-off keeps it for its whole wait
class Call:
    """One tools/call. The frame fills who asks and what; each stage after adds what it found (route, decision,
    admission, credential, outcome, result), and the timers note how long each stage took."""

    name: str
    arguments: dict[str, Any]
    trace_id: str
    origin: str = AGENT
    caller: Caller | None = None
    request_id: uuid.UUID = field(default_factory=uuid.uuid4)
    ctx: ServerRequestContext | None = None  # an agent's request
    relay: Relay | None = None  # where what the upstream sends meanwhile goes (an agent's calls)
    rounds: dict[str, Any] | None = None  # a 2026-07-28 agent's answers to what an upstream asked
    execution: str = ""  # the request id of the code mode execution that made the call
    actor: str = ""  # the operator of a console test
    own_tools: Mapping[str, OwnRun] = field(default_factory=dict)  # code mode's tools, where the frame offers them
    task: "CallTask | None" = None  # the task a 2025-11-25 client asked the call be made as (task_state.py)
    # caller
    unverified: Unverified | None = None  # the session's state as this process last read it, not yet checked
    snap: Snapshot | None = None
    tunnel: SessionTunnel | None = None  # the handoff the session is in
    # route
    own: str = ""  # one of the gateway's own tools (ACTIVATE, RETURN, a key of own_tools), or "" for an upstream's
    triage: TriageEntry | None = None  # ACTIVATE's
    upstream: str = ""  # the upstream the name points at, for the audit
    route: Route | None = None
    # decide, admit
    denial: Denial | None = None
    stage: str = ""  # the stage running
    extra_stage: str = ""  # the operator's stage that refused the call (handoff/stages.py)
    credential: CredentialRef | None = None  # a per-person upstream's: whose credential the call uses
    sign_off: SignOffTerms | None = None  # what a sign-off rule asks before the call runs
    definition_sha256: str = ""  # the tool's pinned definition, which a sign-off binds
    override: Override | None = None  # the owner's, once `arguments` are the upstream's (trims the result)
    given: dict[str, Any] | None = None  # the agent's own arguments, where an override mapped them (for a retry)
    signed_off: str = ""  # the id of the sign-off this call used
    admission: Admission | None = None  # held while the call runs; given back with the completion row
    probing: bool = False  # this call is the half-open circuit's one probe
    approved: bool = False
    arguments_sha256: str = ""  # their digest, made once for both rows of an approved call
    # execute, and after
    outcome: Outcome | None = None
    result: dict[str, Any] | None = None
    duration_ms: float = 0.0
    after_failed: bool = False  # a step after execute raised: the call ran, its result is withheld
    stage_audit: dict[str, dict[str, Any]] = field(default_factory=dict)  # what after-execute stages noted
    timers: dict[str, float] = field(default_factory=dict)  # stage -> seconds
    span: Span = field(default_factory=current_span)  # the call's own (its request's, or a code call's)
    traced: bool = field(default_factory=stage_spans_wanted)  # a span per stage, too
    started: float = field(default_factory=time.perf_counter)

    @property
    def asked(self) -> dict[str, Any]:
        """The arguments as the agent sent them: what a call made again (a task's, once signed off) starts from."""
        return self.given if self.given is not None else self.arguments

    @property
    def tool(self) -> str:
        """The tool the rows name: the upstream's, or the gateway tool's own name once it is let through."""
        if self.own and not self.denial:
            return self.name
        return self.route.tool if self.route else ""

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000
