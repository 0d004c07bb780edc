from django.conf import settings
from django.contrib import admin
from django.contrib.auth.views import LoginView
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView
from oauth2_provider import views as oauth
from rest_framework.routers import SimpleRouter

from audit.api import AuditEventViewSet
from gateway_project.metrics import metrics_view
from handoff.api import HandoffRouteViewSet
from handoff.views import claim_redeem, protected_resource
from policy.account_views import my_account, my_sign_off
from policy.api import AgentViewSet, RuleViewSet, ServerGroupViewSet
from policy.authorization_views import ConsentView, RegistrationView
from policy.console_sign_in import ConsoleCallback, ConsoleSignIn
from policy.sign_off_api import SignOffViewSet
from registry.api import (
    ConnectionViewSet,
    LocalPrefixViewSet,
    MyConnectionViewSet,
    PinnedItemViewSet,
    ToolViewSet,
    UpstreamViewSet,
    VirtualServerViewSet,
)
from registry.connection_views import connection, connection_disconnect, connections
from registry.oauth_views import connection_callback, connection_client, connection_oauth

admin.autodiscover()  # the console's pages, which Django's setup leaves to their first use (audit/apps.py)

api = SimpleRouter(trailing_slash=False)
api.register("upstreams", UpstreamViewSet)
api.register("tools", ToolViewSet, basename="tool")
api.register("pinned-items", PinnedItemViewSet, basename="pinned-item")
api.register("local-prefixes", LocalPrefixViewSet)
api.register("virtual-servers", VirtualServerViewSet)
api.register("handoff-routes", HandoffRouteViewSet)
api.register("groups", ServerGroupViewSet)
api.register("agents", AgentViewSet)
api.register("rules", RuleViewSet)
api.register("signoffs", SignOffViewSet, basename="signoff")
api.register("audit", AuditEventViewSet)
api.register("connections", ConnectionViewSet)
api.register("my/connections", MyConnectionViewSet, basename="my-connection")

# The built-in authorization server: django-oauth-toolkit's views, with our consent page and registration;
# its metadata and OIDC discovery at the origin, which is its issuer.
authorization_server = [
    path(".well-known/oauth-authorization-server", oauth.OAuthServerMetadataView.as_view()),
    path(
        ".well-known/openid-configuration", oauth.ConnectDiscoveryInfoView.as_view(), name="oidc-connect-discovery-info"
    ),
    path("oauth/authorize/", ConsentView.as_view(), name="authorize"),
    path("oauth/token/", oauth.TokenView.as_view(), name="token"),
    path("oauth/revoke_token/", oauth.RevokeTokenView.as_view(), name="revoke-token"),
    path("oauth/jwks/", oauth.JwksInfoView.as_view(), name="jwks-info"),
    path("oauth/userinfo/", oauth.UserInfoView.as_view(), name="user-info"),
    path("oauth/register/", RegistrationView.as_view(), name="dcr-register"),
    path(
        "oauth/register/<str:client_id>/",
        oauth.DynamicClientRegistrationManagementView.as_view(),
        name="dcr-register-management",
    ),
]

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/")),  # the console is the only page a person opens
    path("admin/", admin.site.urls),
    path("api/v1/schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/", include(api.urls)),
    path("metrics", metrics_view),
    path("handoff/redeem", claim_redeem),
    path(".well-known/oauth-protected-resource", protected_resource),
    path(".well-known/oauth-protected-resource/mcp", protected_resource),
    path(".well-known/oauth-protected-resource/mcp/s/<slug:server>", protected_resource),
    path("", include((authorization_server, "oauth2_provider"))),
    path(
        "accounts/login/",
        LoginView.as_view(
            template_name="registration/login.html",
            extra_context={"sso": bool(settings.GATEWAY_CONSOLE_OIDC_CLIENT_ID)},
        ),
        name="login",
    ),
    path("account/", my_account, name="my-account"),
    path("account/sign-offs/<uuid:ident>/", my_sign_off, name="my-sign-off"),
    path("account/connections/", connections, name="connections"),
    path("account/connections/<slug:slug>/", connection, name="connection"),
    path("account/connections/<slug:slug>/disconnect/", connection_disconnect, name="connection-disconnect"),
    path("account/connections/<slug:slug>/oauth/", connection_oauth, name="connection-oauth"),
    path("account/connect-callback/", connection_callback, name="connection-callback"),
    path("account/connect-client/", connection_client, name="connection-client"),
    path("oidc/authenticate/", ConsoleSignIn.as_view(), name="console-sso"),
    path("oidc/callback/", ConsoleCallback.as_view(), name="console-sso-callback"),
]
