import unicodedata
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from audit.models import DEFAULT_TEAM

# Control, format (zero-width, bidi), surrogate, private-use and unassigned characters, and line breaks.
INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def visible_name(value: str) -> None:
    """Names show in the console, the trail, filters and logs: each character must be one a person sees."""
    hidden = next((c for c in value if unicodedata.category(c) in INVISIBLE), None)
    if hidden is not None:
        what = unicodedata.name(hidden, "a control character")
        raise ValidationError(f"Use visible characters only: this holds U+{ord(hidden):04X} ({what}).")
    if value != value.strip():
        raise ValidationError("Remove the spaces at the start or end.")


def limit_field(help_text: str) -> models.PositiveIntegerField:
    """A per-object limit; empty means the deployment's default (settings.GATEWAY_*)."""
    return models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)], help_text=help_text)


class Team(models.Model):
    """Who owns upstreams, server groups, agents (and so their keys), agent groups, rules and handoff routes
    (docs/teams.md). People belong to teams with a role each; a gateway admin (a superuser) manages teams."""

    slug = models.SlugField(max_length=32, unique=True, help_text="How audit rows and the API name the team")
    name = models.CharField(max_length=64, unique=True, validators=[visible_name])
    # Over all the team's agents together (docs/teams.md, "Limits per team").
    calls_per_minute = limit_field("Tool calls in any 60 seconds; empty: GATEWAY_TEAM_CALLS_PER_MINUTE")
    max_concurrent = limit_field("Calls running at once; empty: GATEWAY_TEAM_MAX_CONCURRENT")
    daily_calls = limit_field("Tool calls in one day, 00:00 to 24:00 UTC; empty: GATEWAY_TEAM_DAILY_CALLS")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


def default_team() -> int:
    """The team an object belongs to when it is made without one: the default team (made by a migration,
    and again here should it be gone, as after a test flushed the database)."""
    # Only the key is read: migrations call this too, when the table may lack columns added later.
    found = Team.objects.filter(slug=DEFAULT_TEAM).values_list("pk", flat=True).first()
    return found or Team.objects.get_or_create(slug=DEFAULT_TEAM, defaults={"name": "Default"})[0].pk


def team_field(related_name: str) -> models.ForeignKey:
    """An object's owner: a team that still owns something cannot be deleted (registry.services.team_delete)."""
    return models.ForeignKey(Team, on_delete=models.PROTECT, default=default_team, related_name=related_name)


def team_slug_of(obj: models.Model) -> str:
    """The slug of the team an object belongs to, as its admin change rows carry it: a team's own, a key's
    agent's, any owned object's; "" for what no team owns (people, identity providers, operators)."""
    if isinstance(obj, Team):
        return obj.slug
    owner = getattr(obj, "agent", None) if isinstance(obj, AgentKey) else obj
    team = getattr(owner, "team", None)
    return team.slug if isinstance(team, Team) else ""


class TeamRole(models.TextChoices):
    ADMIN = "admin", "Admin: manages the team's objects and members"
    MEMBER = "member", "Member: calls the team's tools"
    AUDITOR = "auditor", "Auditor: reads the team's audit trail"


# When several of a person's groups give them a role in one team, the first of these wins.
ROLE_ORDER = (TeamRole.ADMIN, TeamRole.MEMBER, TeamRole.AUDITOR)


class TeamMember(models.Model):
    """A console account's role in a team."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="members")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships")
    role = models.CharField(max_length=8, choices=TeamRole.choices)

    class Meta:
        ordering = ["team__slug", "user__username"]
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="team_member_once")]

    def __str__(self) -> str:
        return f"{self.user} ({self.role} of {self.team.slug})"


class TeamGroup(models.Model):
    """People in this group (at the IdP, or a console group for the built-in sign-in) have `role` in `team`,
    as agent groups map IdP groups to agents (AgentGroup.idp_groups)."""

    group = models.CharField(max_length=150, validators=[visible_name], help_text="The group's name, exactly")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="idp_groups")
    role = models.CharField(max_length=8, choices=TeamRole.choices)

    class Meta:
        ordering = ["group", "team__slug"]
        verbose_name = "team group mapping"
        constraints = [models.UniqueConstraint(fields=["group", "team"], name="team_group_once")]

    def __str__(self) -> str:
        return f"{self.group} → {self.role} of {self.team.slug}"


class ServerGroup(models.Model):
    class Isolation(models.TextChoices):
        STRICT = "strict", "Strict: a session that enters this group stays in it"
        OPEN = "open", "Open: reachable from any session"

    name = models.CharField(max_length=64, unique=True, validators=[visible_name])
    team = team_field("server_groups")
    isolation = models.CharField(max_length=8, choices=Isolation.choices, default=Isolation.OPEN)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Agent(models.Model):
    """A client of the gateway (an MCP host such as Claude Desktop or an automation)."""

    name = models.CharField(max_length=64, unique=True, validators=[visible_name])
    team = team_field("agents")
    enabled = models.BooleanField(default=True)
    calls_per_minute = limit_field("Tool calls in any 60 seconds; empty: GATEWAY_AGENT_CALLS_PER_MINUTE")
    max_calls_per_session = limit_field("Tool calls in one session; empty: GATEWAY_SESSION_MAX_CALLS")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AgentKey(models.Model):
    """An API key: only its SHA-256 is stored. Keys are 256-bit random, so a fast hash is enough."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="keys")
    prefix = models.CharField(max_length=16, unique=True, help_text="Public part of the key, for lookup")
    digest = models.CharField(max_length=64)
    label = models.CharField(max_length=64, blank=True)
    revoked = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Refused from then on; empty: never")
    tools = models.CharField(
        max_length=512,
        blank=True,
        help_text="Tool names it may call, space-separated, * as a wildcard (time__*); empty: all its agent may",
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_keys",
        help_text="The person whose personal key this is: its calls are audited as them",
    )
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_from = models.CharField(max_length=64, blank=True, editable=False, help_text="Client address")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"sb_{self.prefix}_…"


class IdentityProvider(models.Model):
    """An OIDC issuer whose JWT access tokens the gateway accepts: its people act as `agent` (whose rules and
    limits apply), each with the agent's rate of their own. GATEWAY_OIDC_* settings define one more."""

    name = models.CharField(max_length=64, unique=True, validators=[visible_name])
    issuer = models.URLField(unique=True, help_text="Exactly as its tokens' iss claim spells it")
    audience = models.CharField(
        max_length=255, blank=True, help_text="What its tokens' aud must hold; empty: the gateway's /mcp URL"
    )
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="identity_providers")
    scopes = models.CharField(max_length=255, blank=True, help_text="Scopes every token must carry, space-separated")
    subject_claim = models.CharField(max_length=64, default="sub")
    groups_claim = models.CharField(
        max_length=64, default="groups", help_text="The person's groups (agent groups map them)"
    )
    name_claim = models.CharField(
        max_length=64, default="name", help_text="The display name (else email, else subject)"
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Person(models.Model):
    """Someone a token named: made on first sight, or beforehand by an admin; a disabled person is refused on
    their next call. Audit rows hold the person as values, so this row may go and the trail stays."""

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    name = models.CharField(max_length=150, blank=True)
    enabled = models.BooleanField(default=True)
    # Their console account, once they signed in to it through the IdP: what My account's pages act as.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="people"
    )
    first_seen = models.DateTimeField(null=True, blank=True)
    last_seen = models.DateTimeField(null=True, blank=True)
    # Their IdP groups at their last console sign-in, replaced at each: what team group mappings give their account.
    signed_in_groups = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["name", "subject"]
        verbose_name_plural = "people"
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="person_once_per_issuer")]

    def __str__(self) -> str:
        return self.name or self.subject


class AgentGroup(models.Model):
    """Agents that rules treat alike (a shift, a product's bots)."""

    name = models.CharField(max_length=64, unique=True, validators=[visible_name])
    team = team_field("agent_groups")
    agents = models.ManyToManyField(Agent, blank=True, related_name="agent_groups")
    idp_groups = models.CharField(
        max_length=512,
        blank=True,
        help_text="Groups (at the IdP, or console groups for the built-in sign-in) whose people count in this "
        "group too, space-separated",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Rule(models.Model):
    """Allow, deny or ask for sign-off on matching calls. Empty subject fields match everything; deny wins, then
    sign-off (which also grants), then allow; with no matching rule the deployment's stance (GATEWAY_POLICY_DEFAULT)
    decides."""

    class Effect(models.TextChoices):
        ALLOW = "allow", "Allow"
        DENY = "deny", "Deny"
        SIGN_OFF = "sign_off", "Sign-off: a person signs off each call before it runs"

    class ToolClass(models.TextChoices):
        """Tools by their annotations. MCP takes a tool with none as neither read-only nor safe to repeat."""

        ANY = "", "Any tool"
        READ_ONLY = "read_only", "Read-only (readOnlyHint)"
        WRITES = "writes", "Not read-only (no readOnlyHint: tools with no annotations too)"
        DESTRUCTIVE = "destructive", "Destructive (not read-only, destructiveHint not false)"
        UNANNOTATED = "unannotated", "No annotations"

    effect = models.CharField(max_length=8, choices=Effect.choices)
    team = team_field("rules")
    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="rules")
    agent_group = models.ForeignKey(AgentGroup, null=True, blank=True, on_delete=models.CASCADE, related_name="rules")
    person = models.ForeignKey(
        "Person", null=True, blank=True, on_delete=models.CASCADE, related_name="rules", help_text="Someone signed in"
    )
    upstream = models.ForeignKey(
        "registry.Upstream", null=True, blank=True, on_delete=models.CASCADE, related_name="rules"
    )
    server_group = models.ForeignKey(ServerGroup, null=True, blank=True, on_delete=models.CASCADE, related_name="rules")
    tool_pattern = models.CharField(
        max_length=128,
        default="*",
        help_text="Shell-style pattern over the upstream's own tool name, e.g. delete_* or get_?",
    )
    tool_class = models.CharField(max_length=12, blank=True, choices=ToolClass.choices, default=ToolClass.ANY)
    # Sign-off rules only (docs/policy.md, "Sign-off").
    signers = models.ForeignKey(
        "auth.Group",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="sign_off_rules",
        help_text="Who may sign off: members of this console group with a role in the caller's team; "
        "empty: the caller themself",
    )
    four_eyes = models.BooleanField(default=False, help_text="Someone other than the caller must sign off")
    sign_off_wait = limit_field("Seconds a request waits for sign-off; empty: GATEWAY_SIGN_OFF_WAIT_SECONDS")
    sign_off_valid = limit_field("Seconds a sign-off stays usable; empty: GATEWAY_SIGN_OFF_VALID_SECONDS")
    sign_off_by_form = models.BooleanField(
        default=False, help_text="The caller may sign off in a form their own client shows (never four eyes)"
    )
    enabled = models.BooleanField(default=True)
    note = models.CharField(max_length=256, blank=True, validators=[visible_name], help_text="Why this rule exists")
    version = models.PositiveIntegerField(default=1, editable=False, help_text="Counts the rule's saves")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["effect", "id"]

    def clean(self) -> None:
        if sum(bool(who) for who in (self.agent_id, self.agent_group_id, self.person_id)) > 1:
            raise ValidationError("Name an agent, an agent group or a person, only one: make several rules.")
        if self.upstream_id and self.server_group_id:
            raise ValidationError("Name an upstream or a server group, not both: make two rules.")
        terms = self.signers_id or self.four_eyes or self.sign_off_wait or self.sign_off_valid or self.sign_off_by_form
        if self.effect != self.Effect.SIGN_OFF and terms:
            raise ValidationError("Only a sign-off rule says who signs off and for how long: clear those fields.")
        if self.four_eyes and not self.signers_id:
            raise ValidationError({"signers": "Four eyes needs someone other than the caller: name a console group."})
        if self.four_eyes and self.sign_off_by_form:
            raise ValidationError(
                {"sign_off_by_form": "A form in the caller's own client is answered by the caller: never four eyes."}
            )

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None:  # a sign-off names the version that asked for it: a changed rule asks again
            self.version += 1
        super().save(*args, **kwargs)

    def __str__(self) -> str:
        who = self.agent or self.agent_group or self.person or "any agent"
        where = self.upstream or self.server_group or "any service"
        return f"{self.effect} {who} → {where} / {self.tool_pattern}"


class SignOff(models.Model):
    """A person's sign-off on one call before it runs (docs/policy.md, "Sign-off"): asked for by a sign-off rule,
    granted or refused in the console or the REST API, used by one call. It binds the caller, the upstream and
    tool, the arguments' RFC 8785 digest, the rule's id and version and the tool's pinned definition."""

    class State(models.TextChoices):
        PENDING = "pending"
        GRANTED = "granted"
        REFUSED = "refused"
        EXPIRED = "expired"
        USED = "used"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="sign_offs", help_text="The caller's")
    # The binding: who calls (the agent and its key, or the person and client), what, with which arguments.
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="sign_offs")
    key_prefix = models.CharField(max_length=16, blank=True, help_text="The API key, when no person called")
    caller_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The caller's console account, where known: who signs off when the rule names no group",
    )
    person_issuer = models.CharField(max_length=255, blank=True)
    person_subject = models.CharField(max_length=255, blank=True)
    person_name = models.CharField(max_length=150, blank=True)
    client_id = models.CharField(max_length=255, blank=True)
    upstream = models.CharField(max_length=32)
    tool = models.CharField(max_length=256, help_text="The upstream's own name")
    exposed_name = models.CharField(max_length=256)
    arguments_sha256 = models.CharField(max_length=64, help_text="Of their RFC 8785 canonical JSON")
    definition_sha256 = models.CharField(max_length=64, blank=True, help_text="The tool's pinned definition")
    rule_id = models.BigIntegerField()
    rule_version = models.PositiveIntegerField()
    # The terms, as the rule set them when asked.
    signers = models.ForeignKey("auth.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    four_eyes = models.BooleanField(default=False)
    by_form = models.BooleanField(default=False)
    valid_seconds = models.PositiveIntegerField(help_text="How long a grant stays usable")
    # As the upstream will receive them; shown to approvers only, and dropped once decided or expired.
    arguments = models.JSONField(null=True, blank=True)
    request_id = models.UUIDField(help_text="The call that asked")
    asked_at = models.DateTimeField(default=timezone.now)
    wait_until = models.DateTimeField(help_text="Expires unless decided by then")
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.CharField(max_length=150, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    usable_until = models.DateTimeField(null=True, blank=True)
    used_at = models.DateTimeField(null=True, blank=True)
    used_by = models.UUIDField(null=True, blank=True, help_text="The call it let run")

    class Meta:
        ordering = ["-asked_at"]
        indexes = [
            models.Index(fields=["team", "state", "-asked_at"]),
            models.Index(fields=["state", "wait_until"]),
        ]
        constraints = [
            # An identical call attaches to the request already pending rather than opening another.
            models.UniqueConstraint(
                fields=[
                    "agent",
                    "key_prefix",
                    "person_issuer",
                    "person_subject",
                    "client_id",
                    "upstream",
                    "tool",
                    "arguments_sha256",
                    "definition_sha256",
                    "rule_id",
                    "rule_version",
                ],
                condition=models.Q(state="pending"),
                name="sign_off_one_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"sign-off {self.id} ({self.state}): {self.exposed_name}"


class AdminToken(models.Model):
    """An operator's token for the REST API, acting as its user with that user's permissions. Only the
    secret's SHA-256 is stored; the token is shown once, when issued."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="admin_tokens")
    prefix = models.CharField(max_length=16, unique=True, help_text="Public part of the token, for lookup")
    digest = models.CharField(max_length=64)
    label = models.CharField(max_length=64, blank=True)
    revoked = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"sba_{self.prefix}_…"


class ConfigVersion(models.Model):
    """One row whose counter goes up in the same transaction as any change to upstreams, tools, groups,
    agents or keys (policy/config_version.py). Every web process compares it with its routing snapshot's."""

    version = models.PositiveBigIntegerField(default=0)

    class Meta:
        db_table = "handoff_configversion"  # created by handoff's first migration, before it moved here

    def __str__(self) -> str:
        return f"configuration version {self.version}"
