"""The demo's stdio servers: what setup_demo registers, and what serve_demo's launcher (manage.py) starts before
Django and the SDK are imported, for the upstream pool to adopt (registry/upstreams/prestart.py)."""

import sys
from pathlib import Path
from typing import Any

from django.conf import settings

from registry.upstreams.launch import server_start
from registry.upstreams.prestart import servers_prestart
from registry.upstreams.sandbox import SandboxSettings


def demo_servers() -> dict[str, dict[str, Any]]:
    """The demo's `mcpServers`: mcp-server-time and the bundled demo server."""
    bin_dir = Path(sys.executable).parent
    return {
        "time": {"command": str(bin_dir / "mcp-server-time"), "args": ["--local-timezone", "UTC"]},
        "demo": {"command": sys.executable, "args": [str(settings.BASE_DIR / "examples/demo_upstream.py")]},
    }


def demo_servers_prestart() -> None:
    """Start the demo's servers as the pool starts those setup_demo registers (no environment, no folder, the
    default sandbox): a server the operator has changed since is not taken, and is stopped."""
    servers_prestart(
        [server_start(slug, s["command"], s["args"], {}, "", SandboxSettings()) for slug, s in demo_servers().items()]
    )
