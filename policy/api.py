"""The REST API of policy: server groups, agents (and their keys) and rules, through the admin's services."""

import copy
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from audit.models import DEFAULT_TEAM
from handoff.explain import ExplainRefused, call_explain
from policy.models import Agent, AgentGroup, Rule, ServerGroup, Team
from policy.selectors import admin_teams, in_teams, team_choices
from policy.services import (
    agent_create,
    agent_key_issue,
    agent_key_revoke,
    agent_set_enabled,
    group_set_enabled,
    policy_object_delete,
    policy_object_save,
    rule_save,
)


class EnabledSerializer(serializers.Serializer):
    enabled = serializers.BooleanField()


def enabled_from(request: Request) -> bool:
    """The `{"enabled": true|false}` a switch was sent (a 400 response otherwise)."""
    body = EnabledSerializer(data=request.data)
    body.is_valid(raise_exception=True)
    return body.validated_data["enabled"]


class NameRelation(serializers.SlugRelatedField):
    """A relation written by its object's name (or slug). A name holding a NUL is refused as not found, since
    PostgreSQL text cannot hold one and the lookup itself would fail (a 500, which the fuzzer found)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str) and "\x00" in data:
            self.fail("does_not_exist", slug_name=self.slug_field, value=data.replace("\x00", "\\x00"))
        return super().to_internal_value(data)


class NamedInTeams(NameRelation):
    """A relation by name to an object of a team the caller administers: another team's is as unknown as a name
    that does not exist (a 400 naming the field, never which teams hold what)."""

    def get_queryset(self) -> Any:
        queryset = super().get_queryset()
        return team_choices(queryset.model, admin_teams(self.context["request"]), queryset)


def by_name(model: Any, field: str = "name") -> NameRelation:
    """A relation read and written by its object's name (or slug), among the caller's teams' objects; optional."""
    return NamedInTeams(slug_field=field, queryset=model.objects.all(), required=False, allow_null=True)


class AuditedModelSerializer(serializers.ModelSerializer):
    """Checks the object as it would be saved (the model's own clean()), then saves it through a service,
    `policy_object_save` unless `persist` says otherwise: every change is an audit row naming the operator."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        team_check(self.context["request"], attrs, creating=self.instance is None)
        self._candidate = copy.copy(self.instance) if self.instance else self.Meta.model()
        for name, value in attrs.items():
            setattr(self._candidate, name, value)
        try:
            self._candidate.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else exc.messages
            ) from None
        return attrs

    def save(self, **kwargs: Any) -> Any:
        actor = self.context["request"].user.get_username()
        self.persist(self._candidate, actor=actor, created=self.instance is None)
        self.instance = self._candidate
        return self.instance

    def persist(self, obj: Any, *, actor: str, created: bool) -> None:
        policy_object_save(obj=obj, actor=actor, created=created)


def team_shown() -> serializers.SlugRelatedField:
    """An object's team, by slug: written on creation or a move, one the caller administers (team_check)."""
    return NameRelation(slug_field="slug", queryset=Team.objects.all(), required=False)


def team_check(request: Request, attrs: dict[str, Any], *, creating: bool) -> None:
    """An object goes only into a team the caller administers (403 otherwise); made without one, into the default
    team if they administer it, else their only team, else they must name it (400)."""
    teams = admin_teams(request)
    if teams is None:
        return
    team = attrs.get("team")
    if team is not None and team.slug not in teams:
        raise PermissionDenied(
            f"You are not an admin of team {team.slug!r}: you make and change only your teams' objects."
        )
    if team is not None or not creating or DEFAULT_TEAM in teams:
        return
    if not teams:
        raise PermissionDenied("You are an admin of no team, so you may make nothing here.")
    if len(teams) > 1:
        raise serializers.ValidationError({"team": [f"Name the team: you are an admin of {', '.join(sorted(teams))}."]})
    attrs["team"] = Team.objects.get(slug=next(iter(teams)))


class TeamScoped:
    """A viewset of teams' objects: to a caller, only its teams' exist (another team's is 404 by every route)."""

    team_path = "team"

    def get_queryset(self) -> Any:
        return in_teams(super().get_queryset(), admin_teams(self.request), self.team_path)


class AuditedViewSet(TeamScoped, viewsets.ModelViewSet):
    def perform_destroy(self, obj: Any) -> None:
        policy_object_delete(obj=obj, actor=self.request.user.get_username())


class ServerGroupSerializer(AuditedModelSerializer):
    upstreams = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)
    team = team_shown()

    class Meta:
        model = ServerGroup
        fields = ("name", "team", "isolation", "enabled", "upstreams")
        read_only_fields = ("enabled",)


class ServerGroupViewSet(AuditedViewSet):
    """Server groups: strict ones keep a session from carrying data between groups."""

    queryset = ServerGroup.objects.select_related("team").prefetch_related("upstreams")
    serializer_class = ServerGroupSerializer
    lookup_field = "name"

    @action(detail=True, methods=["post"], serializer_class=EnabledSerializer)
    def enabled(self, request: Request, name: str) -> Response:
        """Switch every upstream of the group on or off at once."""
        group = self.get_object()
        group_set_enabled(group=group, enabled=enabled_from(request), actor=request.user.get_username())
        return Response({"enabled": group.enabled})


class AgentSerializer(AuditedModelSerializer):
    groups = serializers.SlugRelatedField(source="agent_groups", slug_field="name", many=True, read_only=True)
    keys = serializers.SerializerMethodField()
    team = team_shown()

    class Meta:
        model = Agent
        fields = (
            "name",
            "team",
            "enabled",
            "calls_per_minute",
            "max_calls_per_session",
            "groups",
            "keys",
            "created_at",
        )
        read_only_fields = ("enabled", "created_at")

    def get_keys(self, agent: Agent) -> list[dict[str, Any]]:
        return [{"prefix": k.prefix, "label": k.label, "revoked": k.revoked} for k in agent.keys.all()]


class IssuedKeySerializer(serializers.Serializer):
    label = serializers.CharField(max_length=64, required=False, allow_blank=True)


def _optional_text(help_text: str) -> serializers.CharField:
    """A query parameter that may be left out or blank ('' then)."""
    return serializers.CharField(max_length=255, required=False, allow_blank=True, default="", help_text=help_text)


class ExplainQuerySerializer(serializers.Serializer):
    tool = serializers.CharField(max_length=300, help_text="The tool as tools/list names it, e.g. demo__add")
    person = _optional_text("A person's subject, for a call made as them")
    issuer = _optional_text("The person's issuer, when several share the subject")
    group = serializers.ListField(
        child=serializers.CharField(max_length=128),
        required=False,
        default=list,
        help_text="The person's groups at their identity provider (repeat the parameter)",
    )


class PersonNamedSerializer(serializers.Serializer):
    issuer = serializers.CharField()
    subject = serializers.CharField()


class GroundsSerializer(serializers.Serializer):
    """What decided: a rule (`rule`, `note`, `effect`) or, with no rule matching, the `stance`."""

    rule = serializers.IntegerField(required=False)
    note = serializers.CharField(required=False)
    effect = serializers.ChoiceField(["allow", "deny"], required=False)
    stance = serializers.ChoiceField(["allow", "deny"], required=False)


class ExplainedSerializer(serializers.Serializer):
    agent = serializers.CharField()
    person = PersonNamedSerializer(allow_null=True)
    tool = serializers.CharField()
    allowed = serializers.BooleanField()
    code = serializers.CharField(help_text="The refusal's code (POLICY_DENIED, AGENT_DISABLED, ...); empty: allowed")
    message = serializers.CharField(help_text="The refusal as the agent would read it; empty: allowed")
    policy = GroundsSerializer(allow_null=True, help_text="Null when decided before the rules (agent disabled, ...)")


class AgentViewSet(AuditedViewSet):
    """Agents. Creating one returns its first API key, once; `keys` issues more; `enabled` switches it."""

    queryset = Agent.objects.select_related("team").prefetch_related("keys", "agent_groups")
    serializer_class = AgentSerializer
    lookup_field = "name"

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        actor = request.user.get_username()
        made = serializer.validated_data
        issued = agent_create(name=made["name"], actor=actor, team=made.get("team"))
        limits = {k: v for k, v in made.items() if k not in ("name", "team")}
        if limits:
            for name, value in limits.items():
                setattr(issued.agent, name, value)
            policy_object_save(obj=issued.agent, actor=actor, created=False)
        body = AgentSerializer(self.get_queryset().get(pk=issued.agent.pk), context={"request": request}).data
        return Response(body | {"key": issued.key}, status=201)

    @action(detail=True, methods=["post"], serializer_class=EnabledSerializer)
    def enabled(self, request: Request, name: str) -> Response:
        agent = self.get_object()
        agent_set_enabled(agent=agent, enabled=enabled_from(request), actor=request.user.get_username())
        return Response({"enabled": agent.enabled})

    @action(detail=True, methods=["post"], serializer_class=IssuedKeySerializer)
    def keys(self, request: Request, name: str) -> Response:
        """A new API key for the agent, shown in this response only."""
        body = IssuedKeySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        issued = agent_key_issue(
            agent=self.get_object(), label=body.validated_data.get("label", ""), actor=request.user.get_username()
        )
        return Response({"key": issued.key}, status=201)

    @action(detail=True, methods=["delete"], url_path="keys/(?P<prefix>[0-9a-f]{12})")
    def key_revoke(self, request: Request, name: str, prefix: str) -> Response:
        agent = self.get_object()
        if not agent.keys.filter(prefix=prefix).exists():
            return Response({"detail": "This agent has no key with that prefix."}, status=404)
        agent_key_revoke(prefix=prefix, actor=request.user.get_username())
        return Response(status=204)

    @extend_schema(parameters=[ExplainQuerySerializer], responses=ExplainedSerializer)
    @action(detail=True, methods=["get"])
    def explain(self, request: Request, name: str) -> Response:
        """Whether this agent (and a person acting through it) may call a tool now, and the rule or the
        stance that decides it: the decision a call would get, without its limits."""
        if not request.user.has_perm("policy.view_rule"):  # the answer shows rules and their notes
            raise PermissionDenied("Explaining a decision needs the permission to view rules.")
        query = ExplainQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        asked = query.validated_data
        try:
            explained = call_explain(
                agents=self.get_queryset(),  # another team's agent is as unknown as none
                agent=name,
                tool=asked["tool"],
                person=asked["person"],
                issuer=asked["issuer"],
                groups=tuple(asked["group"]),
            )
        except ExplainRefused as refused:
            return Response({"detail": str(refused)}, status=404 if refused.not_found else 400)
        return Response(explained.shown())


class RuleSerializer(AuditedModelSerializer):
    agent = by_name(Agent)
    agent_group = by_name(AgentGroup)
    # The upstream by its model, not an import: registry builds on policy.
    upstream = by_name(Rule._meta.get_field("upstream").related_model, "slug")
    server_group = by_name(ServerGroup)
    team = team_shown()

    class Meta:
        model = Rule
        fields = (
            "id",
            "team",
            "effect",
            "agent",
            "agent_group",
            "upstream",
            "server_group",
            "tool_pattern",
            "enabled",
            "note",
        )

    def persist(self, obj: Rule, *, actor: str, created: bool) -> None:
        rule_save(rule=obj, actor=actor, created=created)


class RuleViewSet(AuditedViewSet):
    """Allow and deny rules; deny wins, and with no match GATEWAY_POLICY_DEFAULT decides."""

    queryset = Rule.objects.select_related("team", "agent", "agent_group", "upstream", "server_group")
    serializer_class = RuleSerializer
