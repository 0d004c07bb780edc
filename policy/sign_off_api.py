"""The REST API of sign-off (`/api/v1/signoffs`): the requests the caller may decide, and their decision. An
approver authenticates as their console account (an admin token, or a personal key for the caller themself)."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from policy.api_auth import AdminTokenAuthentication, PersonalKeyAuthentication
from policy.models import SignOff
from policy.sign_off import REASON_CHARS, SignOffRefused, approver_refusal, sign_off_decide, sign_offs_for


class SignOffSerializer(serializers.ModelSerializer):
    """A request as its approvers see it: who asks, on whose behalf, which tool, with which arguments (as the
    upstream will receive them, while pending), under which rule."""

    agent = serializers.CharField(source="agent.name")
    team = serializers.CharField(source="team.slug")
    signers = serializers.CharField(source="signers.name", default="", help_text="Empty: the caller themself")

    class Meta:
        model = SignOff
        fields = (
            "id", "state", "team", "agent", "person_name", "person_subject", "client_id", "upstream", "tool",
            "exposed_name", "arguments", "arguments_sha256", "rule_id", "rule_version", "signers", "four_eyes",
            "asked_at", "wait_until", "decided_at", "decided_by", "reason", "usable_until", "used_at",
        )  # fmt: skip


class DecisionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=REASON_CHARS, required=False, allow_blank=True, default="")


class Refused(APIException):
    def __init__(self, refused: SignOffRefused) -> None:
        super().__init__(str(refused))
        self.status_code = refused.status


class SignOffViewSet(viewsets.ViewSet):
    """Pending sign-off requests this account may decide, oldest first; grant or refuse one (a refusal says why)."""

    authentication_classes = (AdminTokenAuthentication, PersonalKeyAuthentication)
    permission_classes = (IsAuthenticated,)
    lookup_value_regex = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"

    @extend_schema(responses=SignOffSerializer(many=True))
    def list(self, request: Request) -> Response:
        return Response(SignOffSerializer(sign_offs_for(request.user), many=True).data)

    @extend_schema(responses=SignOffSerializer)
    def retrieve(self, request: Request, pk: str) -> Response:
        found = SignOff.objects.select_related("agent", "team", "signers").filter(pk=pk).first()
        refusal = SignOffRefused(404, f"No sign-off request {pk!r}.") if found is None else None
        if found is not None and (refusal := approver_refusal(request.user, found)) is None:
            return Response(SignOffSerializer(found).data)
        assert refusal is not None
        raise Refused(refusal)

    @extend_schema(request=DecisionSerializer, responses=SignOffSerializer)
    @action(detail=True, methods=["post"])
    def grant(self, request: Request, pk: str) -> Response:
        return self._decide(request, pk, grant=True)

    @extend_schema(request=DecisionSerializer, responses=SignOffSerializer)
    @action(detail=True, methods=["post"])
    def refuse(self, request: Request, pk: str) -> Response:
        return self._decide(request, pk, grant=False)

    def _decide(self, request: Request, pk: str, *, grant: bool) -> Response:
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            decided = sign_off_decide(sign_off_id=pk, user=request.user, grant=grant, **body.validated_data)
        except SignOffRefused as refused:
            raise Refused(refused) from None
        return Response(SignOffSerializer(decided).data)
