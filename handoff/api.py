"""The REST API's handoff routes: the triage tools the gateway offers (`handoff_to_<domain>`), saved through
the same audited service as the admin."""

from handoff.models import HandoffRoute
from policy.api import AuditedModelSerializer, AuditedViewSet, NamedInTeams, team_shown
from registry.models import Upstream


class HandoffRouteSerializer(AuditedModelSerializer):
    target = NamedInTeams(slug_field="slug", queryset=Upstream.objects.all())  # one of the caller's teams' upstreams
    team = team_shown()

    class Meta:
        model = HandoffRoute
        exclude = ("id",)


class HandoffRouteViewSet(AuditedViewSet):
    """Handoff routes by domain; a route's target is an upstream's slug."""

    queryset = HandoffRoute.objects.select_related("target", "team")
    serializer_class = HandoffRouteSerializer
    lookup_field = "domain"
