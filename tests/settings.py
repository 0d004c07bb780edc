"""The test process's own settings: the gateway's, except that catalog syncs run inline here.
The gateways under test are separate Daphne processes with their own environment (tests/servers.py)."""

from gateway_project.settings import *  # noqa: F403

GATEWAY_EXECUTOR = "inline"
