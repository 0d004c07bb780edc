"""ASGI entry point: HTTP (admin, /mcp, a virtual server's /mcp/s/<name>) and WebSocket (/mcp/ws, /mcp/s/<name>/ws)
through Channels routing."""

import gc
import logging
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway_project.settings")
# Django must be set up before anything imports models.
django_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from audit.telemetry import http_metered  # noqa: E402
from gateway_project.checks import start_warnings_log  # noqa: E402
from handoff.endpoints.consumers import McpWebSocketConsumer  # noqa: E402
from handoff.endpoints.http import mcp_http_app  # noqa: E402
from handoff.endpoints.probes import drain, healthz_app, readyz_app  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The console's static files are served by Django (WhiteNoise), so one process needs nothing in front.
        "http": http_metered(
            URLRouter(
                [
                    path("mcp", drain.tracked(mcp_http_app)),
                    path("mcp/s/<slug:server>", drain.tracked(mcp_http_app)),  # a virtual server
                    path("healthz", healthz_app),
                    path("readyz", readyz_app),
                    re_path(r"", django_app),
                ]
            )
        ),
        "websocket": URLRouter(
            [
                path("mcp/ws", McpWebSocketConsumer.as_asgi()),
                path("mcp/s/<slug:server>/ws", McpWebSocketConsumer.as_asgi()),
            ]
        ),
    }
)

if settings.GATEWAY_ANONYMOUS_AGENT:
    logging.getLogger(__name__).warning(
        "GATEWAY_ANONYMOUS_AGENT is set: requests without credentials act as agent %r. "
        "Use it only where nobody else can reach this gateway.",
        settings.GATEWAY_ANONYMOUS_AGENT,
    )
start_warnings_log()
# uvicorn's access lines are INFO records of a logger uvicorn set up before Django's LOGGING: a LOG_LEVEL above INFO
# drops them too (a line a request: 2 % of a profile of the process under load), never lowers uvicorn's own level.
_access = logging.getLogger("uvicorn.access")
_access.setLevel(max(_access.level, logging.getLevelName(settings.LOG_LEVEL)))

# What is loaded by now (Django, the apps, the SDK) lives as long as the process: out of the collector's sight, a
# full collection scans only what requests made. Each one pauses every call in flight: 150-220 ms before, 10-14 ms
# after, on the machine of docs/reliability.md's load shedding, and the largest part of admitted calls' p99.
gc.freeze()
