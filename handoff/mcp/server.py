"""The gateway's handler table, an SDK `Server`: tools and handoffs (tools.py), resources, prompts and
completions (passthrough.py), change subscriptions (list_changed.py), tasks of calls waiting for sign-off
(task_calls.py). `handle` (handle.py) runs it for
`/mcp/ws` and for `/mcp` (handoff/endpoints/streamable_http/)."""

import warnings
from typing import Any

from django.conf import settings
from mcp import types
from mcp.server import NotificationOptions, Server
from mcp.server.caching import CacheHint
from mcp.server.models import InitializationOptions
from mcp.shared.exceptions import MCPDeprecationWarning

from gateway_project import __version__
from handoff.mcp import passthrough
from handoff.mcp.agent_relay import set_logging_level
from handoff.mcp.caller import answering
from handoff.mcp.list_changed import RememberSessions
from handoff.mcp.pipeline.tool_task import EXTENSION
from handoff.mcp.task_calls import (
    CAPABILITY,
    TaskAnswers,
    UpdateTaskParams,
    cancel_task,
    get_task,
    task_result,
    update_task,
)
from handoff.mcp.tools import call_tool, list_tools
from handoff.snapshot import ServerEntry, snapshot

INSTRUCTIONS = (
    "This is a gateway to several services. Tool and prompt names are '<service>{sep}<name>', resource URIs "
    "'<service>+<uri>'; call tools/list to see what you may use."
)
# Lists are filtered per caller: private. Resources and prompts are the upstreams' live word: never fresh; tools/list
# sets its own `ttlMs` from the snapshot it is served from (tools.py).
PRIVATE = CacheHint(ttl_ms=0, scope="private")
MAX_STAMPS = 1000  # serverInfo stamps kept: one per virtual server


class GatewayServer(Server):
    """Tells 2025-11-25 clients that its lists change: a handoff switches the tools, an upstream changes
    its own. (2026-07-28 clients learn it from `subscriptions/listen` being served.) Its instructions
    include what the upstreams say of themselves (cleaned like tool descriptions). Through a virtual server,
    its name, title and instructions are that server's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._stamps: dict[tuple[str, str] | None, dict[str, Any]] = {}
        super().__init__(*args, **kwargs)

    @property
    def name(self) -> str:
        return virtual.name if (virtual := _virtual_server()) else self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value

    @property
    def title(self) -> str | None:
        return (virtual.title or None) if (virtual := _virtual_server()) else self._title

    @title.setter
    def title(self, value: str | None) -> None:
        self._title = value

    @property
    def _server_info_stamp_source(self) -> dict[str, Any]:
        """The `serverInfo` every 2026-07-28 result is stamped with (the SDK computes it once per server): dumped
        once per virtual server, and for /mcp."""
        virtual = _virtual_server()
        key = (virtual.name, virtual.title) if virtual else None
        if (dumped := self._stamps.get(key)) is None:
            if len(self._stamps) >= MAX_STAMPS:  # servers renamed many times: start again
                self._stamps.clear()
            dumped = self._stamps[key] = self.server_info.model_dump(by_alias=True, mode="json", exclude_none=True)
        return dumped

    @property
    def instructions(self) -> str:
        """The gateway's, and those of the upstreams the asking agent may reach (none when no caller is known); a
        virtual server's own, when it has any."""
        if (virtual := _virtual_server()) and virtual.instructions:
            return virtual.instructions
        snap, caller = snapshot.latest, answering.get()
        given = snap.instructions if snap and caller else ()
        said = "\n\n".join(f"## {slug}\n{text}" for slug, text in given if snap.reachable(caller.who, slug))
        return f"{self._instructions}\n\nWhat the services say of themselves:\n\n{said}" if said else self._instructions

    @instructions.setter
    def instructions(self, value: str | None) -> None:
        self._instructions = value or ""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        options = notification_options or NotificationOptions(
            tools_changed=True, prompts_changed=True, resources_changed=True
        )
        initialization = super().create_initialization_options(options, experimental_capabilities, extensions)
        initialization.capabilities.tasks = CAPABILITY  # calls waiting for sign-off (task_calls.py)
        return initialization


def _virtual_server() -> ServerEntry | None:
    """The virtual server the request being answered came through, if any."""
    snap, caller = snapshot.latest, answering.get()
    return snap.servers.get(caller.server) if snap and caller and caller.server else None


def build_server() -> Server:
    with warnings.catch_warnings():  # logging is gone from 2026-07-28, but 2025-11-25 agents still set levels
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        gateway = _gateway_server()
    # In place of the SDK's OpenTelemetry middleware: a request's SERVER span is audit/telemetry.py's mcp_span, and
    # the SDK's, on the global tracer (a no-op unless something installs a provider), would only repeat it.
    gateway.middleware = [RememberSessions(), TaskAnswers()]
    gateway.add_request_handler("tasks/get", types.GetTaskRequestParams, get_task)
    gateway.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, task_result)
    gateway.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, cancel_task)
    gateway.add_request_handler("tasks/update", UpdateTaskParams, update_task)
    gateway.extensions[EXTENSION] = {}  # 2026-07-28's Tasks extension, for calls waiting for sign-off
    return gateway


def _gateway_server() -> GatewayServer:
    return GatewayServer(
        settings.GATEWAY_NAME,
        version=__version__,
        instructions=INSTRUCTIONS.format(sep=settings.GATEWAY_TOOL_SEPARATOR),
        cache_hints={
            method: PRIVATE for method in ("tools/list", "resources/list", "resources/templates/list", "prompts/list")
        },
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=passthrough.list_resources,
        on_list_resource_templates=passthrough.list_resource_templates,
        on_read_resource=passthrough.read_resource,
        on_subscribe_resource=passthrough.subscribe_resource,
        on_unsubscribe_resource=passthrough.unsubscribe_resource,
        on_list_prompts=passthrough.list_prompts,
        on_get_prompt=passthrough.get_prompt,
        on_completion=passthrough.complete,
        on_subscriptions_listen=passthrough.subscriptions_listen,
        on_set_logging_level=set_logging_level,
    )


server = build_server()
