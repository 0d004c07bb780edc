"""The test process's own settings: the gateway's, except that catalog syncs run inline here.
The gateways under test are separate Daphne processes with their own environment (tests/servers.py).
The test runner opts in to keys made once in var/ (GATEWAY_MAKE_KEYS) though it runs on PostgreSQL, and so do
the processes it starts, which inherit its environment."""

import os

os.environ.setdefault("GATEWAY_MAKE_KEYS", "1")

from gateway_project.settings import *  # noqa: E402, F403

GATEWAY_EXECUTOR = "inline"
# The test servers listen on 127.0.0.1: allowing that one address (and no other private one) lets HTTP
# upstreams in the tests go through the SSRF guard, as in production, instead of being marked internal.
GATEWAY_EGRESS_ALLOWED_NETWORKS = ["127.0.0.1/32"]
