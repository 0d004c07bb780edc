"""The REST API of the service registry: upstreams, through the same audited services as the admin.

Credentials (env values, headers, query values; a query typed into `url` moves to `query`) are write-only: a
read shows each stored one as a mask, and a write that sends the mask keeps what is stored under that name.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import F
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from policy.api import (
    AuditedModelSerializer,
    AuditedViewSet,
    EnabledSerializer,
    NameRelation,
    TeamScoped,
    by_name,
    enabled_from,
    team_check,
    team_shown,
)
from policy.api_auth import AdminTokenAuthentication, PersonalKeyAuthentication
from policy.limits.stores import limit_store
from policy.models import ServerGroup, Team
from registry.connection_views import MAX_TOKEN_CHARS, people_of
from registry.forms import MASK, unmasked
from registry.models import LocalPrefix, PersonalCredential, PinnedItem, Tool, ToolOverride, Upstream, VirtualServer
from registry.overrides import override_json
from registry.package_pins import package_summary
from registry.personal import personal_connect, personal_disconnect, personal_revoke
from registry.pinned_items import pinned_item_approve
from registry.secret_store import SecretStoreUnavailable
from registry.server_overrides import (
    server_override_clear,
    server_override_set,
    server_overrides_json,
    tool_by_key,
    tool_key,
)
from registry.services import (
    SyncReport,
    local_prefix_set,
    tool_approve,
    tool_override_clear,
    tool_override_set,
    upstream_catalog_sync,
    upstream_delete,
    upstream_register,
    upstream_save,
    upstream_set_enabled,
    upstream_share,
)
from registry.upstreams.outcome import DOCUMENT_REFUSED

STORE_DOWN = "The credential store cannot be reached now: nothing was stored. Try again soon."


class SecretMapField(serializers.DictField):
    child = serializers.CharField(allow_blank=True, max_length=8192)

    def to_representation(self, value: dict[str, str]) -> dict[str, str]:
        return dict.fromkeys(value, MASK)


class UpstreamSerializer(AuditedModelSerializer):
    group = by_name(ServerGroup)
    env = SecretMapField(required=False)
    headers = SecretMapField(required=False)
    query = SecretMapField(required=False)
    person_client = SecretMapField(required=False)
    circuit = serializers.SerializerMethodField()
    reachable = serializers.BooleanField(source="is_healthy", read_only=True)
    package = serializers.SerializerMethodField(help_text="An npx or uvx server's pinned package, and one held")
    team = team_shown()
    shared_with = serializers.SlugRelatedField(slug_field="slug", many=True, read_only=True)

    class Meta:
        model = Upstream
        exclude = ("id", "created_at", "updated_at")
        read_only_fields = (
            "enabled",
            "shared_with_all",
            "revision",
            "last_synced_at",
            "last_sync_error",
            "health",
            "health_cause",
            "health_checked_at",
            "protocol_version",
            "instructions",
        )

    def get_package(self, upstream: Upstream) -> dict[str, Any]:
        return {state: package_summary(pin) for state, pin in upstream.package.items()}

    def get_circuit(self, upstream: Upstream) -> dict[str, Any]:
        status = limit_store().breaker(upstream.id)
        return {"state": status.state, "failures": status.failures, "retry_after": round(status.retry_after, 3)}

    def _unmasked(self, name: str, values: dict[str, str]) -> dict[str, str]:
        merged, unknown = unmasked(values, getattr(self.instance, name) if self.instance else {})
        if unknown:
            raise serializers.ValidationError({name: f"Send a value for {', '.join(unknown)}: none is stored yet."})
        return merged

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        for name in Upstream.SECRET_MAPS:
            if name in attrs:
                attrs[name] = self._unmasked(name, attrs[name])
        return super().validate(attrs)

    def persist(self, obj: Upstream, *, actor: str, created: bool) -> None:
        upstream_save(upstream=obj, actor=actor, created=created)


class SyncReportSerializer(serializers.Serializer):
    upstream = serializers.CharField()
    ok = serializers.BooleanField()
    added = serializers.ListField(child=serializers.CharField())
    changed = serializers.ListField(child=serializers.CharField())
    removed = serializers.ListField(child=serializers.CharField())
    held = serializers.ListField(child=serializers.CharField(), help_text="Waiting for an administrator's approval")
    rejected = serializers.ListField(child=serializers.CharField(), help_text='"name: why"')
    error = serializers.CharField()
    summary = serializers.CharField()


class ShareSerializer(serializers.Serializer):
    shared_with = serializers.SlugRelatedField(slug_field="slug", queryset=Team.objects.all(), many=True)
    shared_with_all = serializers.BooleanField(default=False)


@contextmanager
def refused_as_400() -> Iterator[None]:
    """A service's ValidationError as the API's 400, by field."""
    try:
        yield
    except DjangoValidationError as exc:
        raise ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages) from None


def _report(report: SyncReport) -> Response:
    return Response(SyncReportSerializer(asdict(report) | {"summary": report.summary()}).data)


class UpstreamViewSet(TeamScoped, viewsets.ModelViewSet):
    """Upstream MCP servers. Saving one (with `enabled`) syncs its tool catalog, as the admin does."""

    queryset = Upstream.objects.select_related("group", "team").prefetch_related("shared_with")
    serializer_class = UpstreamSerializer
    lookup_field = "slug"

    def perform_create(self, serializer: UpstreamSerializer) -> None:
        upstream = serializer.save()
        if upstream.enabled:
            report = upstream_register(upstream=upstream, actor=self.request.user.get_username())
            if report.code == DOCUMENT_REFUSED:
                raise serializers.ValidationError({"openapi_url": [report.error]})

    def perform_update(self, serializer: UpstreamSerializer) -> None:
        upstream = serializer.save()
        if upstream.enabled:
            upstream_catalog_sync(upstream=upstream)

    def perform_destroy(self, upstream: Upstream) -> None:
        upstream_delete(upstream=upstream, actor=self.request.user.get_username())

    @action(detail=True, methods=["post"], serializer_class=EnabledSerializer)
    def enabled(self, request: Request, slug: str) -> Response:
        """Switch the upstream on (and sync its tools) or off, effective at once."""
        upstream = self.get_object()
        upstream_set_enabled(upstream=upstream, enabled=enabled_from(request), actor=request.user.get_username())
        if upstream.enabled:
            upstream_catalog_sync(upstream=upstream)
        return Response({"enabled": upstream.enabled})

    @extend_schema(request=None, responses=SyncReportSerializer)
    @action(detail=True, methods=["post"])
    def sync(self, request: Request, slug: str) -> Response:
        """Sync the upstream's tool catalog now (through the pins) and say what changed."""
        return _report(upstream_catalog_sync(upstream=self.get_object()))

    @extend_schema(request=ShareSerializer, responses=ShareSerializer)
    @action(detail=True, methods=["post"])
    def share(self, request: Request, slug: str) -> Response:
        """Share the upstream with exactly these teams (or with all): refused while a team already uses one of
        the names it would expose, unless that team gave the upstream a local prefix (`local-prefixes`)."""
        upstream = self.get_object()
        given = ShareSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        teams, everyone = given.validated_data["shared_with"], given.validated_data["shared_with_all"]
        actor = request.user.get_username()
        with refused_as_400():
            upstream_share(upstream=upstream, teams=teams, shared_with_all=everyone, actor=actor)
        return Response(ShareSerializer({"shared_with": teams, "shared_with_all": everyone}).data)


class ToolSerializer(serializers.ModelSerializer):
    upstream = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    approved = serializers.BooleanField(source="is_approved", read_only=True)

    class Meta:
        model = Tool
        exclude = ("approved_definition",)


class PinnedItemSerializer(serializers.ModelSerializer):
    upstream = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    approved = serializers.BooleanField(source="is_approved", read_only=True)

    class Meta:
        model = PinnedItem
        fields = "__all__"  # the approved copy too: it is what agents get while a change waits


class PinViewSet(TeamScoped, viewsets.ReadOnlyModelViewSet):
    """Pins of what upstreams say. `?upstream=<slug>` narrows them; `?pending=true` lists those whose definition
    changed and waits for approval (agents get the approved version meanwhile, or nothing)."""

    team_path = "upstream__team"

    def get_permissions(self) -> list[Any]:
        # Approving a pin and overriding a tool change it (as in the admin): not the adding a POST would ask for.
        return [IsAuthenticated()] if self.action in ("approve", "override") else super().get_permissions()

    def get_queryset(self):
        pins = super().get_queryset()
        if slug := self.request.query_params.get("upstream"):
            pins = pins.filter(upstream__slug=slug)
        if self.request.query_params.get("pending") == "true":
            pins = pins.exclude(approved_sha256=F("definition_sha256"))
        return pins

    def _approve(self, request: Request, approve: Any) -> Response:
        model = self.queryset.model._meta
        if not request.user.has_perm(f"registry.change_{model.model_name}"):
            needs = f"the permission to change {model.verbose_name_plural}"
            raise PermissionDenied(f"Approving a {model.verbose_name} needs {needs}.")
        pin = self.get_object()
        if not pin.is_approved:
            approve(pin, actor=request.user.get_username())
        return Response(self.get_serializer(pin).data)


class ToolViewSet(PinViewSet):
    """The catalog as upstreams list it."""

    queryset = Tool.objects.select_related("upstream").order_by("upstream__slug", "name")
    serializer_class = ToolSerializer

    @extend_schema(request=None, responses=ToolSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        """Approve the tool's current definition: agents are offered it from now on."""
        return self._approve(request, lambda tool, actor: tool_approve(tool=tool, actor=actor))

    @extend_schema(request=dict[str, Any], responses=dict[str, Any])
    @action(detail=True, methods=["get", "put", "delete"])
    def override(self, request: Request, pk: str) -> Response:
        """How agents see the tool (docs/curation.md): GET it, PUT a whole override, DELETE it. The tool's pin
        goes on comparing the upstream's own definition."""
        tool = self.get_object()
        if request.method != "GET" and not request.user.has_perm("registry.change_tool"):
            raise PermissionDenied("Overriding a tool needs the permission to change tools.")
        actor = request.user.get_username()
        if request.method == "DELETE":
            tool_override_clear(tool=tool, actor=actor)
            return Response(status=204)
        if request.method == "PUT":
            with refused_as_400():
                tool_override_set(tool=tool, data=request.data, actor=actor)
        row = ToolOverride.objects.filter(tool=tool).first()
        return Response(override_json(row.value()) if row else {})


class PinnedItemViewSet(PinViewSet):
    """Resources, resource templates, prompts and instructions as upstreams say them (`?kind=` narrows them)."""

    queryset = PinnedItem.objects.select_related("upstream").order_by("upstream__slug", "kind", "key")
    serializer_class = PinnedItemSerializer

    def get_queryset(self):
        items = super().get_queryset()
        return items.filter(kind=kind) if (kind := self.request.query_params.get("kind")) else items

    @extend_schema(request=None, responses=PinnedItemSerializer)
    @action(detail=True, methods=["post"])
    def approve(self, request: Request, pk: str) -> Response:
        """Approve the item's current definition: agents get it from now on."""
        return self._approve(request, lambda item, actor: pinned_item_approve(item=item, actor=actor))


class ConnectionSerializer(serializers.ModelSerializer):
    upstream = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = PersonalCredential
        fields = (
            "id",
            "upstream",
            "person_issuer",
            "person_subject",
            "person_name",
            "kind",
            "connected_at",
            "expires_at",
            "last_used_at",
            "refresh_failed_at",
            "revoked_at",
            "revoked_by",
        )


class PersonalTokenSerializer(serializers.Serializer):
    token = serializers.CharField(write_only=True, max_length=MAX_TOKEN_CHARS, trim_whitespace=True)

    def validate_token(self, token: str) -> str:
        if any(not char.isprintable() or char.isspace() for char in token):
            raise serializers.ValidationError("A token is one line of visible characters, without spaces.")
        return token


class MyConnectionViewSet(viewsets.ViewSet):
    """The caller's own connections to per-person upstreams, authenticated with their personal key (or their
    own admin token). PUT stores a personal token (sealed at once; nobody reads it back), DELETE disconnects."""

    authentication_classes = (PersonalKeyAuthentication, AdminTokenAuthentication)
    permission_classes = (IsAuthenticated,)
    lookup_field = "slug"

    def _mine(self, request: Request):
        people = {p[:2] for p in people_of(request)}
        rows = PersonalCredential.objects.select_related("upstream").order_by("upstream__slug")
        return [
            c
            for c in rows.filter(person_subject__in={p[1] for p in people})
            if (c.person_issuer, c.person_subject) in people
        ]

    @extend_schema(responses=ConnectionSerializer(many=True))
    def list(self, request: Request) -> Response:
        return Response(ConnectionSerializer(self._mine(request), many=True).data)

    @extend_schema(request=PersonalTokenSerializer, responses=ConnectionSerializer)
    def update(self, request: Request, slug: str) -> Response:
        upstream = Upstream.objects.filter(slug=slug, per_person=True, enabled=True).first()
        if upstream is None:
            raise NotFound(f"No enabled per-person upstream {slug!r}.")
        if upstream.person_connect != Upstream.PersonConnect.TOKEN:
            how = upstream.get_person_connect_display()
            raise ValidationError({"token": f"{slug} is connected by {how}, not with a pasted token."})
        given = PersonalTokenSerializer(data=request.data)
        given.is_valid(raise_exception=True)
        issuer, subject, name = people_of(request)[0]
        try:
            credential = personal_connect(
                upstream=upstream,
                issuer=issuer,
                subject=subject,
                name=name,
                kind=PersonalCredential.Kind.TOKEN,
                values={"token": given.validated_data["token"]},
            )
        except SecretStoreUnavailable:
            return Response({"detail": STORE_DOWN}, status=503)
        return Response(ConnectionSerializer(credential).data)

    def destroy(self, request: Request, slug: str) -> Response:
        mine = [c for c in self._mine(request) if c.upstream.slug == slug]
        if not mine:
            raise NotFound(f"You have no connection to {slug!r}.")
        for credential in mine:
            personal_disconnect(credential)
        return Response(status=204)


class ConnectionViewSet(TeamScoped, viewsets.ReadOnlyModelViewSet):
    """Who has connected what (never a value), for administrators; `revoke` makes a person connect again."""

    queryset = PersonalCredential.objects.select_related("upstream")
    serializer_class = ConnectionSerializer
    team_path = "upstream__team"

    def get_permissions(self) -> list[Any]:
        return [IsAuthenticated()] if self.action == "revoke" else super().get_permissions()

    @extend_schema(request=None, responses=ConnectionSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        if not request.user.has_perm("registry.change_personalcredential"):
            raise PermissionDenied("Revoking a connection needs the permission to change personal credentials.")
        credential = self.get_object()
        personal_revoke(credential, actor=request.user.get_username())
        credential.refresh_from_db()
        return Response(ConnectionSerializer(credential).data)


class LocalPrefixSerializer(serializers.ModelSerializer):
    upstream = NameRelation(slug_field="slug", queryset=Upstream.objects.all())  # shared or not yet (docs/teams.md)
    team = team_shown()

    class Meta:
        model = LocalPrefix
        fields = ("id", "upstream", "team", "prefix", "created_at", "updated_at")
        read_only_fields = ("created_at", "updated_at")
        validators = []  # one per upstream and team, one prefix per team: local_prefix_set says so in words

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None:  # a local prefix is renamed, never moved to another upstream or team
            attrs |= {"upstream": self.instance.upstream, "team": self.instance.team}
        team_check(self.context["request"], attrs, creating=self.instance is None)
        return attrs

    def save(self, **kwargs: Any) -> LocalPrefix:
        data, actor = self.validated_data, self.context["request"].user.get_username()
        with refused_as_400():
            self.instance = local_prefix_set(
                upstream=data["upstream"], team=data["team"], prefix=data["prefix"], actor=actor
            )
        return self.instance


class LocalPrefixViewSet(TeamScoped, viewsets.ModelViewSet):
    """A team's local prefixes for upstreams other teams share with it: its agents see such an upstream's tools as
    `<prefix><separator><tool>`. Every change is audited; deleting one gives the upstream its own namespace back."""

    queryset = LocalPrefix.objects.select_related("upstream", "team")
    serializer_class = LocalPrefixSerializer
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def perform_destroy(self, row: LocalPrefix) -> None:
        with refused_as_400():
            local_prefix_set(upstream=row.upstream, team=row.team, prefix="", actor=self.request.user.get_username())


class VirtualServerSerializer(AuditedModelSerializer):
    team = team_shown()
    tools = serializers.ListField(child=serializers.CharField(trim_whitespace=False), required=False)
    resources = serializers.ListField(child=serializers.CharField(trim_whitespace=False), required=False)
    prompts = serializers.ListField(child=serializers.CharField(trim_whitespace=False), required=False)

    class Meta:
        model = VirtualServer
        fields = (
            "name", "team", "title", "instructions", "tools", "resources", "prompts", "enabled", "created_at",
            "updated_at",
        )  # fmt: skip
        read_only_fields = ("created_at", "updated_at")


class VirtualServerViewSet(AuditedViewSet):
    """Virtual servers: curated endpoints at /mcp/s/<name>, each offering the tools it names (exposed names, or
    shell patterns) to its team's agents and people, under its own name, title and instructions. Every change
    is audited."""

    queryset = VirtualServer.objects.select_related("team")
    serializer_class = VirtualServerSerializer
    lookup_field = "name"

    def get_permissions(self) -> list[Any]:
        # Overriding a tool changes the server (checked below): not the deleting a DELETE would ask for.
        return [IsAuthenticated()] if self.action == "override" else super().get_permissions()

    @extend_schema(request=None, responses=dict[str, Any])
    @action(detail=True, methods=["get"])
    def overrides(self, request: Request, name: str) -> Response:
        """The server's own overrides of tools it offers (docs/curation.md): `<upstream slug>/<tool>` -> override."""
        return Response(server_overrides_json(server=self.get_object()))

    @extend_schema(request=dict[str, Any], responses=dict[str, Any])
    @action(detail=True, methods=["get", "put", "delete"], url_path=r"overrides/(?P<upstream>[^/]+)/(?P<tool>[^/]+)")
    def override(self, request: Request, name: str, upstream: str, tool: str) -> Response:
        """How the server's sessions see one tool it offers: GET it, PUT a whole override (on top of the upstream's,
        its parameters named as /mcp shows them), DELETE it."""
        server = self.get_object()
        found = tool_by_key(f"{upstream}/{tool}", seen_by=server.team)  # another team's tools are unknown here
        if found is None:
            raise NotFound(f"The catalog has no tool {tool!r} of upstream {upstream!r}.")
        if request.method != "GET" and not request.user.has_perm("registry.change_virtualserver"):
            raise PermissionDenied("Overriding a virtual server's tool needs the permission to change virtual servers.")
        actor = request.user.get_username()
        if request.method == "DELETE":
            server_override_clear(server=server, tool=found, actor=actor)
            return Response(status=204)
        if request.method == "PUT":
            with refused_as_400():
                server_override_set(server=server, tool=found, data=request.data, actor=actor)
        return Response(server_overrides_json(server=server).get(tool_key(found), {}))
