from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models, transaction

from policy.models import ServerGroup, Team, limit_field, team_field
from registry.overrides import OVERRIDE_KEYS, Override, override_parse
from registry.upstreams.egress import url_problem
from registry.upstreams.sandbox import sandbox_problem

# Slugs never contain "_" or ".", so every allowed separator splits an exposed name unambiguously.
slug_validator = RegexValidator(
    r"^[a-z][a-z0-9]*(-[a-z0-9]+)*\Z",
    "Lower-case letters and digits in words joined by single hyphens, starting with a letter.",
)


REST_SELECT_KEYS = ("include_tags", "exclude_tags", "include", "exclude")


def query_split(url: str) -> tuple[str, dict[str, str]]:
    """The URL without its query, and the query's parameters: what `Upstream.query` keeps sealed."""
    parts = urlsplit(url)
    if not parts.query:
        return url, {}
    return urlunsplit(parts._replace(query="")), dict(parse_qsl(parts.query, keep_blank_values=True))


class Upstream(models.Model):
    class Transport(models.TextChoices):
        STDIO = "stdio", "stdio subprocess"
        STREAMABLE_HTTP = "streamable_http", "Streamable HTTP"
        SSE = "sse", "HTTP+SSE (2024-11-05)"
        REST = "rest", "REST service (OpenAPI or declared operations)"

    class Health(models.TextChoices):
        UNKNOWN = "unknown", "never reached"
        OK = "ok", "ok"
        FAILING = "failing", "failing"

    class NewTools(models.TextChoices):
        HOLD = "hold", "Hold for an administrator's approval"
        APPROVE = "approve", "Approve automatically"

    class PersonConnect(models.TextChoices):
        TOKEN = "token", "A personal token the person pastes"
        OAUTH = "oauth", "The upstream's own OAuth sign-in"
        EXCHANGE = "exchange", "Token exchange (RFC 8693) of the person's sign-in token"

    slug = models.CharField(
        max_length=32, unique=True, validators=[slug_validator], help_text="Namespace of this upstream's tools"
    )
    name = models.CharField(max_length=128, blank=True)
    team = team_field("upstreams")
    shared_with_all = models.BooleanField(
        default=False, help_text="Every other team may call its tools (under their own rules), not change it"
    )
    shared_with = models.ManyToManyField(
        Team,
        blank=True,
        related_name="borrowed_upstreams",
        help_text="Teams that may call its tools (under their own rules), not change it",
    )
    transport = models.CharField(max_length=16, choices=Transport.choices)
    command = models.CharField(max_length=512, blank=True)
    args = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True, help_text="Environment for a stdio server")
    cwd = models.CharField(max_length=512, blank=True)
    sandbox = models.JSONField(
        default=dict,
        blank=True,
        help_text='A stdio server\'s sandbox: {"network": "none" (only its own loopback), "outbound" (the public '
        'internet) or "host" (unconfined network), "paths": ["/srv/data", "/srv/out:rw"] (read-only unless :rw), '
        '"memoryMb", "pids", "cpus"}; docs/security.md',
    )
    package = models.JSONField(
        default=dict,
        blank=True,
        editable=False,
        help_text="An npx or uvx server's package: the pinned install it runs, and a newer one held for approval "
        "(registry/upstreams/packages/)",
    )
    url = models.URLField(max_length=1024, blank=True)
    headers = models.JSONField(default=dict, blank=True, help_text="HTTP headers sent to the upstream")
    query = models.JSONField(
        default=dict,
        blank=True,
        help_text="Query parameters added to the URL (a query typed into the URL moves here): keys often travel "
        "there, so their values are sealed like headers",
    )
    # Kind rest (registry/rest/, docs/rest-upstreams.md): `url` is where calls go (empty: the document's servers).
    openapi_url = models.URLField(
        max_length=1024,
        blank=True,
        help_text="REST: where its OpenAPI 3.0/3.1 document is; fetched again at every sync, so a changed document "
        "changes the catalog",
    )
    openapi_document = models.TextField(
        blank=True, help_text="REST: an uploaded OpenAPI 3.0/3.1 document (JSON or YAML)"
    )
    rest_operations = models.JSONField(
        default=list,
        blank=True,
        help_text="REST without a document: operations declared by hand (name, method, path, parameters)",
    )
    rest_select = models.JSONField(
        default=dict,
        blank=True,
        help_text='REST: which operations become tools: {"include_tags": [], "exclude_tags": [], "include": [], '
        '"exclude": []} (operation ids)',
    )
    read_only = models.BooleanField(default=False, help_text="REST: only GET and HEAD operations become tools")
    group = models.ForeignKey(ServerGroup, null=True, blank=True, on_delete=models.SET_NULL, related_name="upstreams")
    enabled = models.BooleanField(default=True)
    internal = models.BooleanField(
        default=False,
        help_text="Allow a private, loopback or link-local address (an upstream inside your own network)",
    )
    prefixed = models.BooleanField(
        default=True,
        help_text="Expose names as slug, separator, name (time__get_current_time). Off: exactly as the upstream "
        "names them, for single-server use; a name that collides with another upstream's is refused at sync",
    )
    handoff_only = models.BooleanField(
        default=False,
        help_text="A specialist reached only through a handoff: its tools are not listed and it is not synced",
    )
    new_tools = models.CharField(
        max_length=8,
        choices=NewTools.choices,
        default=NewTools.HOLD,
        help_text="What happens to a tool that appears after the first catalog sync",
    )
    timeout = models.FloatField(
        default=settings.GATEWAY_DEFAULT_TIMEOUT,
        validators=[MinValueValidator(0.1), MaxValueValidator(settings.GATEWAY_MAX_TIMEOUT)],
        help_text="Seconds a tool call may take; progress notifications do not extend it",
    )
    calls_per_minute = limit_field("Tool calls in any 60 seconds; empty: GATEWAY_UPSTREAM_CALLS_PER_MINUTE")
    max_concurrent = limit_field("Calls running at once; empty: GATEWAY_UPSTREAM_MAX_CONCURRENT")
    breaker_failures = limit_field(
        "Consecutive failures or timeouts that open the circuit; empty: GATEWAY_BREAKER_FAILURES"
    )
    breaker_recovery = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.1)],
        help_text=(
            "The longest an open circuit waits before one probe call (it first waits "
            "GATEWAY_BREAKER_FIRST_OPEN_SECONDS, doubling on each failed probe); "
            "empty: GATEWAY_BREAKER_RECOVERY_SECONDS"
        ),
    )
    per_person = models.BooleanField(
        default=False,
        help_text="Each person reaches it with their own credential (connected once, in My account: Connections); "
        "off: one shared credential for everyone",
    )
    person_connect = models.CharField(
        max_length=8,
        choices=PersonConnect.choices,
        default=PersonConnect.TOKEN,
        help_text="How a person gets their credential for a per-person upstream",
    )
    person_slot = models.CharField(
        max_length=128,
        default="bearer",
        help_text="Where a person's credential goes: bearer (Authorization: Bearer), header:<Name>, query:<name>, "
        "or for stdio env:<NAME>",
    )
    person_client = models.JSONField(
        default=dict,
        blank=True,
        help_text="The gateway's client at the upstream's authorization server: client_id and client_secret "
        "(sealed). Empty for OAuth: registered dynamically. Needed for token exchange",
    )
    person_scope = models.CharField(max_length=512, blank=True, help_text="Scopes to ask for (OAuth, token exchange)")
    exchange_url = models.URLField(max_length=1024, blank=True, help_text="Token exchange: the token endpoint")
    exchange_audience = models.CharField(
        max_length=1024, blank=True, help_text="Token exchange: the audience to ask for; empty: the upstream's URL"
    )
    catalog_credential = models.ForeignKey(
        "PersonalCredential",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Per person: whose connection syncs the catalog and probes health (an admin's own)",
    )
    # Bumped on every change of how to reach the upstream, so executors reconnect.
    revision = models.PositiveIntegerField(default=1)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    last_sync_error = models.TextField(blank=True)
    # What the last sync, call or probe found (registry/upstreams/health.py); the cause is for operators, never a model.
    health = models.CharField(max_length=8, choices=Health.choices, default=Health.UNKNOWN, editable=False)
    health_cause = models.TextField(blank=True, editable=False)
    health_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # What the upstream said of itself at the last sync: the protocol era it speaks (server/discover is
    # tried first, then initialize), and its instructions, which the gateway's own include.
    protocol_version = models.CharField(max_length=16, blank=True)
    instructions = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    CONNECTION_FIELDS = (
        "transport",
        "command",
        "args",
        "env",
        "cwd",
        "sandbox",
        "url",
        "headers",
        "query",
        "openapi_url",
        "openapi_document",
        "rest_operations",
        "rest_select",
        "read_only",
    )
    SECRET_MAPS = (
        "env",
        "headers",
        "query",
        "person_client",
    )  # name -> value maps whose values are sealed (credentials.py)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        # Its row before its catalog's (a catalog sync's order, services.py): else a sync meanwhile deadlocks with it.
        with transaction.atomic():
            Upstream.objects.select_for_update().filter(pk=self.pk).first()
            return super().delete(*args, **kwargs)

    def clean(self) -> None:
        if self.slug == settings.GATEWAY_NAME:
            raise ValidationError({"slug": f"{self.slug!r} is the gateway's own namespace (GATEWAY_NAME)."})
        if self.transport == self.Transport.STDIO and not self.command:
            raise ValidationError({"command": "A stdio upstream needs a command."})
        if self.transport == self.Transport.REST:
            self._rest_clean()
        elif self.transport != self.Transport.STDIO and not self.url:
            raise ValidationError({"url": "An HTTP upstream needs a URL."})
        if urlsplit(self.url).username is not None:
            clear = "Credentials in the URL would be stored and shown in clear: put them in a header, which is sealed."
            raise ValidationError({"url": clear})
        pairs = parse_qsl(urlsplit(self.url).query, keep_blank_values=True)
        if len({name for name, _ in pairs}) < len(pairs):
            raise ValidationError({"url": "The URL's query names a parameter twice; each may appear once."})
        for field in ("url", "openapi_url"):
            url = getattr(self, field)
            if url and self.transport != self.Transport.STDIO and not self.internal and (problem := url_problem(url)):
                raise ValidationError({field: f"{problem}. Mark the upstream as internal to allow it."})
        for field in self.SECRET_MAPS:
            value = getattr(self, field)
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise ValidationError({field: "A JSON object of strings."})
        if not isinstance(self.args, list) or not all(isinstance(a, str) for a in self.args):
            raise ValidationError({"args": "A JSON list of strings."})
        if problem := sandbox_problem(self.sandbox):
            raise ValidationError({"sandbox": problem})
        if self.per_person:
            self._person_clean()

    def _rest_clean(self) -> None:
        """One source of operations: a document's URL, an uploaded document, or operations declared by hand."""
        sources = [bool(self.openapi_url), bool(self.openapi_document), bool(self.rest_operations)]
        if sum(sources) != 1:
            raise ValidationError(
                {
                    "openapi_url": "A REST upstream takes one of: its OpenAPI document's URL, an uploaded document, "
                    "or operations declared by hand."
                }
            )
        if urlsplit(self.openapi_url).username is not None:
            raise ValidationError({"openapi_url": "Credentials in the URL would be stored in clear: use a header."})
        if (size := len(self.openapi_document.encode())) > settings.GATEWAY_REST_DOCUMENT_MAX_BYTES:
            limit = settings.GATEWAY_REST_DOCUMENT_MAX_BYTES
            raise ValidationError({"openapi_document": f"The document is {size:,} bytes; the limit is {limit:,}."})
        if self.rest_operations and not self.url:
            raise ValidationError({"url": "Operations declared by hand need the service's base URL."})
        if not isinstance(self.rest_operations, list):
            raise ValidationError({"rest_operations": "A JSON list of operations."})
        select = self.rest_select
        if (
            not isinstance(select, dict)
            or set(select) - set(REST_SELECT_KEYS)
            or not all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in select.values())
        ):
            keys = ", ".join(REST_SELECT_KEYS)
            raise ValidationError({"rest_select": f"A JSON object whose keys ({keys}) hold lists of strings."})

    def _person_clean(self) -> None:
        kind, _, name = self.person_slot.partition(":")
        stdio = self.transport == self.Transport.STDIO
        if stdio and (kind != "env" or not name):
            raise ValidationError({"person_slot": "A stdio upstream takes a person's credential as env:<NAME>."})
        if not stdio and not (kind == "bearer" and not name or kind in ("header", "query") and name):
            raise ValidationError({"person_slot": "bearer, header:<Name> or query:<name>."})
        if stdio and self.person_connect != self.PersonConnect.TOKEN:
            raise ValidationError({"person_connect": "A stdio upstream takes a pasted personal token."})
        if self.person_connect == self.PersonConnect.EXCHANGE and not (self.exchange_url and self.person_client):
            raise ValidationError({"exchange_url": "Token exchange needs its token endpoint and a client."})
        if self.person_connect != self.PersonConnect.TOKEN and kind != "bearer":
            raise ValidationError({"person_slot": "OAuth and token exchange give a bearer token."})

    @property
    def call_timeout(self) -> float:
        """The timeout a call gets: the upstream's own, never past the deployment's hard maximum (rows can
        bypass the form's validation)."""
        return min(self.timeout, settings.GATEWAY_MAX_TIMEOUT)

    @property
    def namespace(self) -> str:
        """What its exposed names and resource URIs start with ("" when unprefixed)."""
        return self.slug if self.prefixed else ""

    @property
    def is_reachable(self) -> bool:
        """Enabled, and not switched off through its group."""
        return self.enabled and (self.group is None or self.group.enabled)

    @property
    def is_healthy(self) -> bool:
        """Reachable, and answering the last time it was tried."""
        return self.is_reachable and self.health == self.Health.OK


class Pin(models.Model):
    """What an upstream says, as last seen by catalog sync, and the pin: the definition an administrator approved.
    Agents get it only as approved (a tool is offered only while the two hashes agree)."""

    definition_sha256 = models.CharField(max_length=64)
    approved_definition = models.JSONField(null=True, blank=True)
    approved_sha256 = models.CharField(max_length=64, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    approved_by = models.CharField(max_length=150, blank=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField()

    class Meta:
        abstract = True

    @property
    def is_approved(self) -> bool:
        return self.approved_sha256 == self.definition_sha256


class Tool(Pin):
    """One tool of one upstream, as last seen by catalog sync."""

    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=256)
    title = models.CharField(max_length=512, blank=True)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    output_schema = models.JSONField(null=True, blank=True)
    annotations = models.JSONField(null=True, blank=True)
    definition = models.JSONField(help_text="The tool as the upstream listed it")

    class Meta:
        ordering = ["upstream__slug", "name"]
        constraints = [models.UniqueConstraint(fields=["upstream", "name"], name="tool_unique_per_upstream")]

    def __str__(self) -> str:
        return f"{self.upstream.slug}/{self.name}"

    @property
    def own_name(self) -> str:
        """The name after the namespace that agents see: its owner's override, or the upstream's."""
        override = getattr(self, "override", None)  # a reverse one-to-one that is missing raises AttributeError
        return (override and override.name) or self.name

    def shown_definition(self) -> dict[str, Any]:
        """The definition agents see before the gateway sanitises it: its owner's override applied."""
        override = getattr(self, "override", None)
        return override.value().definition(self.definition) if override else self.definition


class OverrideFields(models.Model):
    """An override of how agents see a tool (registry/overrides.py), as stored: what an upstream's tool holds now,
    and a virtual server's tool can hold too. Blank fields keep the upstream's."""

    name = models.CharField(max_length=128, blank=True, help_text="The tool's name after the namespace")
    title = models.CharField(max_length=512, blank=True)
    description = models.TextField(blank=True)
    annotations = models.JSONField(null=True, blank=True)
    params = models.JSONField(default=dict, blank=True, help_text="Parameter -> hidden, name, description, value")
    output = models.JSONField(default=list, blank=True, help_text="structuredContent fields kept (empty: all)")
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        abstract = True

    def value(self) -> Override:
        return override_parse({key: getattr(self, key) for key in OVERRIDE_KEYS})


class ToolOverride(OverrideFields):
    """An upstream's tool as its owner presents it to agents; its pin still compares the upstream's definition."""

    tool = models.OneToOneField(Tool, on_delete=models.CASCADE, related_name="override")

    def __str__(self) -> str:
        return f"override of {self.tool}"


class PinnedItem(Pin):
    """Something other than a tool that an upstream says, pinned like a tool: a resource or resource template
    (its list entry), a prompt (its list entry and, when it takes no required argument, the text prompts/get
    gives), or its instructions. Agents get the approved copy; a changed one waits for an administrator."""

    class Kind(models.TextChoices):
        RESOURCE = "resource", "resource"
        RESOURCE_TEMPLATE = "resource_template", "resource template"
        PROMPT = "prompt", "prompt"
        INSTRUCTIONS = "instructions", "instructions"

    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="pinned_items")
    kind = models.CharField(max_length=24, choices=Kind.choices)
    key = models.CharField(max_length=1024, blank=True, help_text="Its URI, URI template or name (instructions: empty)")
    definition = models.JSONField(help_text="What the upstream says now")

    class Meta:
        ordering = ["upstream__slug", "kind", "key"]
        constraints = [models.UniqueConstraint(fields=["upstream", "kind", "key"], name="pinned_item_unique")]

    def __str__(self) -> str:
        return f"{self.upstream.slug} {self.get_kind_display()}" + (f" {self.key}" if self.key else "")


class ToolEmbedding(models.Model):
    """A tool's sentence (its name and first sentence, code mode's search) embedded once for every process:
    a process that starts loads what another computed instead of spending seconds of CPU per hundred tools."""

    model = models.CharField(max_length=64, help_text="The embedding model and its version")
    sentence_sha256 = models.CharField(max_length=64)
    vector = models.BinaryField(help_text="float32, little-endian")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "sentence_sha256"], name="embedding_unique")]


class PersonalCredential(models.Model):
    """One person's credential for one per-person upstream. The row is what anyone may see (whose, what kind,
    since when, until when); the values live sealed in the secret store (registry/secret_store.py), which
    only the executor opens."""

    class Kind(models.TextChoices):
        TOKEN = "token", "personal token"
        OAUTH = "oauth", "OAuth"

    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="personal_credentials")
    person_issuer = models.CharField(max_length=255)
    person_subject = models.CharField(max_length=255)
    person_name = models.CharField(max_length=150, blank=True)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    # Bumped whenever the values change (a new token, a refresh), so executors reconnect with the new ones.
    version = models.PositiveIntegerField(default=1)
    connected_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="When the access token runs out")
    refresh_failed_at = models.DateTimeField(
        null=True, blank=True, help_text="Its refresh failed: the person must connect again"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # The team under whose path the values are (registry/secret_store.py): the upstream's when they were stored,
    # "" for values stored before teams. manage.py move_credentials moves them to the upstream's team now.
    secret_team = models.CharField(max_length=32, blank=True, editable=False)

    class Meta:
        ordering = ["upstream__slug", "person_name", "person_subject"]
        constraints = [
            models.UniqueConstraint(
                fields=["upstream", "person_issuer", "person_subject"], name="personal_credential_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.upstream.slug} for {self.person_name or self.person_subject}"


class SealedSecret(models.Model):
    """The database backend of the secret store: sealed values by path (only the executor opens them)."""

    path = models.CharField(max_length=512, unique=True)
    values = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)


class ConnectAttempt(models.Model):
    """An OAuth sign-in under way at an upstream's authorization server: its `state`, used once."""

    state_sha256 = models.CharField(max_length=64, unique=True)
    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="+")
    person_issuer = models.CharField(max_length=255)
    person_subject = models.CharField(max_length=255)
    person_name = models.CharField(max_length=150, blank=True)
    material = models.JSONField(default=dict, help_text="Endpoints, client, the PKCE verifier sealed")
    expires_at = models.DateTimeField()


class LocalPrefix(models.Model):
    """A team's own name for another team's upstream: its agents see that upstream's tools as
    `<prefix><separator><tool>` and its resources as `<prefix>+<uri>`, in place of the upstream's own namespace.
    Given by the borrowing team (issue 36: names across teams), so that a share whose names the team already
    uses can go ahead; it takes effect while the upstream is shared with the team."""

    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="local_prefixes")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="local_prefixes")
    prefix = models.CharField(
        max_length=32, validators=[slug_validator], help_text="Namespace of the upstream's tools for this team"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["team__slug", "prefix"]
        constraints = [
            models.UniqueConstraint(fields=["upstream", "team"], name="local_prefix_one_per_team"),
            models.UniqueConstraint(fields=["team", "prefix"], name="local_prefix_unique_in_team"),
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}: {self.prefix} ({self.upstream.slug})"

    def clean(self) -> None:
        if self.prefix == settings.GATEWAY_NAME:
            raise ValidationError({"prefix": f"{self.prefix!r} is the gateway's own namespace (GATEWAY_NAME)."})
        if self.upstream_id and self.team_id and self.upstream.team_id == self.team_id:
            raise ValidationError({"prefix": "A team names its own upstream by its slug: change the slug instead."})


class VirtualServer(models.Model):
    """A curated endpoint, `/mcp/s/<name>` (issue 38): the tools it names, of those its caller may use, under its own
    name, title and instructions. Its callers are its team's agents and people; policy, limits, sign-off and audit
    are `/mcp`'s, and every audit row of a call through it names it."""

    name = models.CharField(
        max_length=64,
        unique=True,
        validators=[slug_validator],
        help_text="Its path: /mcp/s/<name>; also the serverInfo name its clients see",
    )
    team = team_field("virtual_servers")
    title = models.CharField(max_length=200, blank=True, help_text="The serverInfo title its clients see")
    instructions = models.TextField(blank=True, help_text="What its clients are told at initialization")
    tools = models.JSONField(
        default=list,
        blank=True,
        help_text="The exposed tool names it offers; '*' and '?' match as in shell patterns (fnmatch)",
    )
    resources = models.JSONField(
        default=list, blank=True, help_text="The exposed URIs of resources and resource templates it offers (patterns)"
    )
    prompts = models.JSONField(default=list, blank=True, help_text="The exposed prompt names it offers (patterns)")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        for field, what in (("tools", "tool names"), ("resources", "resource URIs"), ("prompts", "prompt names")):
            listed = getattr(self, field)
            if not isinstance(listed, list) or not all(isinstance(t, str) and 0 < len(t) <= 1024 for t in listed):
                raise ValidationError({field: f"A list of exposed {what} or patterns, each 1 to 1024 characters."})
            if len(set(listed)) != len(listed):
                twice = sorted({t for t in listed if listed.count(t) > 1})
                raise ValidationError({field: f"{twice[0]!r} is listed twice."})


class ServerToolOverride(OverrideFields):
    """A virtual server's own presentation of a tool it offers, on top of the upstream's override (docs/curation.md):
    for that server's sessions only. Its parameters are named as /mcp shows the tool."""

    server = models.ForeignKey(VirtualServer, on_delete=models.CASCADE, related_name="overrides")
    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="server_overrides")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["server", "tool"], name="server_override_once")]

    def __str__(self) -> str:
        return f"{self.server.name}: override of {self.tool}"
